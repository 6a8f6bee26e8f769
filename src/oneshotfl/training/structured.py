"""Structured pruning: channel groups found by tracing, the group-lasso proximal step, and the
physical removal of pruned groups (a smaller dense model, not a mask).

A *channel group* is one output unit of a producing layer — a ``Conv2d`` filter or a
``Linear`` neuron — together with everything only that unit feeds: its bias, its entries in
the BatchNorm layers and depthwise convolutions that follow it, and its input slice in the one
layer that consumes it. :func:`channel_groups` finds them on any model ``torch.fx`` can trace:
from each producer it follows the single path of users through zero-preserving, channel-wise
operations (ReLU, ReLU6, pooling, flatten, dropout, identity; BatchNorm and depthwise
convolutions are sliced with the unit) to exactly one consumer. A unit whose path branches,
meets a residual addition, a concatenation or the model's output is not prunable, so a
ResNet's block outputs stay and its inner ``conv1`` filters are groups; MobileNetV2's
expansion channels are groups; the classifier head never is.

When every parameter of a group is zero (producer row and bias, BatchNorm weight and bias,
depthwise filter), the unit outputs exactly zero in training and in evaluation mode, the
operations on its path keep it zero, and :func:`remove_groups` deletes it without changing
the model's outputs. :func:`group_lasso_prox` is the proximal operator of the weighted group
lasso Σ_g t_g ‖θ_g‖₂ (Yuan and Lin 2006; on filters and neurons: Wen et al., "Learning
Structured Sparsity in Deep Neural Networks", NeurIPS 2016), which zeroes whole groups.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

_PASS_MODULES = (
    nn.ReLU,
    nn.ReLU6,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.Flatten,
    nn.Dropout,
    nn.Identity,
)
_PASS_FUNCTIONS: set[Callable[..., object]] = {
    F.relu,
    F.relu6,
    torch.relu,
    torch.flatten,
    F.max_pool2d,
    F.avg_pool2d,
    F.adaptive_avg_pool2d,
    F.dropout,
}
_PASS_METHODS = {"relu", "flatten"}
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


class StructureError(ValueError):
    """A model whose channel groups cannot be found or removed as asked."""


@dataclass(frozen=True)
class ChannelGroup:
    """The prunable units of one producing layer.

    Attributes:
        producer: module path of the ``Conv2d`` (``groups == 1``) or ``Linear`` whose output
            units these are.
        followers: module paths of the BatchNorm layers and depthwise convolutions on the
            path to the consumer, sliced with the unit.
        consumer: module path of the layer that reads the units.
        fan: the consumer's inputs per unit (the spatial positions a ``Flatten`` laid out,
            channel-major; 1 when the consumer is a convolution or reads the units directly).
    """

    producer: str
    followers: tuple[str, ...]
    consumer: str
    fan: int


def _is_producer(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1)


def _is_depthwise(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.Conv2d)
        and module.groups > 1
        and module.groups == module.in_channels == module.out_channels
    )


def _units(module: nn.Module) -> int:
    if isinstance(module, nn.Conv2d):
        return module.out_channels
    if isinstance(module, nn.Linear):
        return module.out_features
    raise StructureError(f"expected a Conv2d or Linear producer, got {type(module).__name__}")


def channel_groups(model: nn.Module) -> list[ChannelGroup]:
    """The channel groups of ``model`` in forward order (see the module docs).

    Raises:
        StructureError: when ``torch.fx`` cannot trace the model.
    """
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception as exc:  # fx raises many types for untraceable code
        raise StructureError(f"cannot trace {type(model).__name__}: {exc}") from None
    modules = dict(model.named_modules())
    groups: list[ChannelGroup] = []
    for node in graph.nodes:
        if node.op == "call_module" and _is_producer(modules[str(node.target)]):
            group = _follow(node, modules)
            if group is not None:
                groups.append(group)
    return groups


def _follow(start: fx.Node, modules: Mapping[str, nn.Module]) -> ChannelGroup | None:
    """The group of ``start``'s units, or None when their path is not prunable."""
    producer = modules[str(start.target)]
    followers: list[str] = []
    flattened = False
    node = start
    while True:
        users = list(node.users)
        if len(users) != 1 or users[0].args[:1] != (node,):
            return None
        node = users[0]
        if node.op == "call_module":
            module = modules[str(node.target)]
            if isinstance(module, _NORMS) and not module.affine:
                return None  # nothing to zero: a removed unit would output -mean/σ
            if isinstance(module, _NORMS) or _is_depthwise(module):
                followers.append(str(node.target))
            elif isinstance(module, _PASS_MODULES):
                flattened |= isinstance(module, nn.Flatten)
            elif _is_producer(module):
                return _consumer_group(start, producer, followers, node, module, flattened)
            else:
                return None
        elif node.op == "call_function" and node.target in _PASS_FUNCTIONS:
            flattened |= node.target is torch.flatten
        elif node.op == "call_method" and node.target in _PASS_METHODS:
            flattened |= node.target == "flatten"
        else:
            return None


def _consumer_group(
    start: fx.Node,
    producer: nn.Module,
    followers: list[str],
    node: fx.Node,
    consumer: nn.Module,
    flattened: bool,
) -> ChannelGroup | None:
    units = _units(producer)
    if isinstance(consumer, nn.Conv2d):
        if flattened or consumer.in_channels != units:
            return None
        fan = 1
    elif isinstance(consumer, nn.Linear):
        inputs = consumer.in_features
        conv = isinstance(producer, nn.Conv2d)
        if inputs % units or ((inputs != units or conv) and not flattened):
            return None  # a linear layer reading an unflattened map acts on its width
        fan = inputs // units
    else:
        return None
    return ChannelGroup(str(start.target), tuple(followers), str(node.target), fan)


def _rows(model: nn.Module, group: ChannelGroup) -> list[torch.Tensor]:
    """Every tensor of the group whose dim 0 indexes its units (parameters only)."""
    modules = dict(model.named_modules())
    rows: list[torch.Tensor] = []
    for path in (group.producer, *group.followers):
        module = modules[path]
        for name in ("weight", "bias"):
            p = getattr(module, name, None)
            if isinstance(p, torch.Tensor):
                rows.append(p)
    return rows


def group_sizes(model: nn.Module, groups: list[ChannelGroup]) -> list[int]:
    """Parameters per unit of each group (the ``p_g`` of the group lasso's √p_g weights)."""
    return [sum(int(t[0].numel()) for t in _rows(model, g)) for g in groups]


def group_norms(model: nn.Module, groups: list[ChannelGroup]) -> list[torch.Tensor]:
    """‖θ_g‖₂ of every unit, per group: ``[units]`` tensors (detached)."""
    out = []
    for g in groups:
        squares = sum(t.detach().reshape(t.shape[0], -1).pow(2).sum(1) for t in _rows(model, g))
        out.append(torch.as_tensor(squares).sqrt())
    return out


@torch.no_grad()
def group_lasso_prox(
    model: nn.Module, groups: list[ChannelGroup], thresholds: list[torch.Tensor]
) -> None:
    """The proximal step of Σ_g t_g ‖θ_g‖₂ in place: θ_g ← θ_g · max(0, 1 − t_g / ‖θ_g‖₂).

    Args:
        model: the model whose groups shrink.
        groups: its channel groups.
        thresholds: per group, ``[units]`` step thresholds ``t_g`` (learning rate × penalty
            strength); a unit whose norm is at most its threshold becomes exactly zero.
    """
    for g, norm, t in zip(groups, group_norms(model, groups), thresholds, strict=True):
        scale = torch.clamp(1 - t.to(norm) / norm.clamp_min(1e-12), min=0.0)
        scale[norm == 0] = 0.0
        for tensor in _rows(model, g):
            tensor.mul_(scale.to(tensor).view(-1, *([1] * (tensor.dim() - 1))))


def channel_responses(
    model: nn.Module, groups: list[ChannelGroup], x: torch.Tensor
) -> list[torch.Tensor]:
    """Each group's unit responses on inputs ``x`` as its consumer sees them: ``[N, units]``
    per group (spatial means for feature maps and flattened maps), with ``model`` in eval
    mode and without gradients."""
    modules = dict(model.named_modules())
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for k, g in enumerate(groups):

        def hook(
            _m: nn.Module, args: tuple[torch.Tensor, ...], k: int = k, g: ChannelGroup = g
        ) -> None:
            inp = args[0]
            units = _units(modules[g.producer])
            seen[k] = inp.reshape(inp.shape[0], units, -1).mean(2).detach().cpu()

        handles.append(modules[g.consumer].register_forward_pre_hook(hook))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return [seen[k] for k in range(len(groups))]


def remove_groups(
    model: nn.Module, groups: list[ChannelGroup], keep: Mapping[str, torch.Tensor]
) -> nn.Module:
    """A copy of ``model`` with only the kept units of each group: producers, followers and
    consumers are rebuilt smaller (dense), every other parameter and buffer is copied.

    Args:
        model: the model (unchanged).
        groups: its channel groups.
        keep: producer path → sorted indices (``LongTensor``) of the units to keep; groups
            not named keep every unit.

    Raises:
        StructureError: for an unknown producer, or indices that are empty, unsorted,
            repeated or out of range.
    """
    out = copy.deepcopy(model)
    modules = dict(out.named_modules())
    by_producer = {g.producer: g for g in groups}
    for name in keep:
        if name not in by_producer:
            raise StructureError(f"remove_groups: expected a producer of {sorted(by_producer)}")
    with torch.no_grad():
        for name, idx in keep.items():
            g = by_producer[name]
            units = _units(modules[g.producer])
            idx = torch.as_tensor(idx, dtype=torch.long).cpu()
            ok = idx.dim() == 1 and len(idx) > 0 and bool((idx[1:] > idx[:-1]).all())
            if not ok or int(idx[0]) < 0 or int(idx[-1]) >= units:
                raise StructureError(
                    f"remove_groups {name}: expected sorted distinct indices in 0..{units - 1}, "
                    f"got {idx.tolist()}"
                )
            _slice_units(modules[g.producer], idx)
            for path in g.followers:
                _slice_units(modules[path], idx)
            wide = (idx[:, None] * g.fan + torch.arange(g.fan)[None, :]).reshape(-1)
            _slice_inputs(modules[g.consumer], wide)
    return out


def _take(tensor: torch.Tensor, dim: int, idx: torch.Tensor) -> torch.Tensor:
    return tensor.index_select(dim, idx.to(tensor.device)).clone()


def _slice_units(module: nn.Module, idx: torch.Tensor) -> None:
    """Keep output units ``idx`` of a producer, BatchNorm or depthwise convolution."""
    for name in ("weight", "bias"):
        p = getattr(module, name, None)
        if isinstance(p, nn.Parameter):
            setattr(module, name, nn.Parameter(_take(p, 0, idx), requires_grad=p.requires_grad))
    for name in ("running_mean", "running_var"):
        b = getattr(module, name, None)
        if isinstance(b, torch.Tensor):
            setattr(module, name, _take(b, 0, idx))
    n = len(idx)
    if isinstance(module, _NORMS):
        module.num_features = n
    elif isinstance(module, nn.Conv2d):
        if module.groups > 1:
            module.in_channels = module.groups = n
        module.out_channels = n
    elif isinstance(module, nn.Linear):
        module.out_features = n


def _slice_inputs(module: nn.Module, idx: torch.Tensor) -> None:
    """Keep inputs ``idx`` of a consumer (a convolution's channels, a linear layer's inputs)."""
    weight = operator.attrgetter("weight")(module)
    module.weight = nn.Parameter(_take(weight, 1, idx), requires_grad=weight.requires_grad)
    if isinstance(module, nn.Conv2d):
        module.in_channels = len(idx)
    elif isinstance(module, nn.Linear):
        module.in_features = len(idx)


def kept_units(norms: torch.Tensor, ratio: float) -> torch.Tensor:
    """The units a ratio-based cut keeps: drop the ``round(ratio · units)`` smallest norms
    (zero norms first, ties by index), keep at least one; sorted CPU indices."""
    units = len(norms)
    drop = min(round(ratio * units), units - 1)
    order = torch.argsort(norms.detach().cpu(), stable=True)
    return torch.sort(order[drop:]).values


def widths(model: nn.Module, groups: list[ChannelGroup]) -> dict[str, int]:
    """Units per producer (a pruned model's architecture beyond its registry name)."""
    modules = dict(model.named_modules())
    return {g.producer: _units(modules[g.producer]) for g in groups}
