"""Client recipes: one declarative description of how a client trains its model.

A :class:`ClientRecipe` is a frozen value whose fields are everything that determines the
trained model — architecture, extra output classes, training settings, the registered
components added to cross-entropy (loss terms, extra example streams such as adversarial
examples), a pruning schedule — so it *is* the cache key: every method of a sweep that asks
for the same recipe on the same client gets the same model, trained once
(:func:`oneshotfl.training.services.train_model`). :func:`train_recipe` executes a
recipe with the one training loop (:func:`oneshotfl.training.loop.fit`).

Per step the loss is ``CE(f(x ⊕ x_extra), y ⊕ y_extra) + Σ loss terms``: a component may
append labelled examples to the batch (``extra_examples``; one forward pass over the joint
batch) and add a term (``loss_term``). Components are active in ``[start_epoch,
stop_epoch)``, which is how a curriculum is written. A plain recipe (no components, no
pruning) is exactly ERM: ``CE(f(x), y)``.

Random streams (see :mod:`oneshotfl.seeding`): the shared initialisation is
``("init", arch, extra_outputs)`` — the same weights for every client of an architecture,
what one-shot FedAvg needs; shuffling is ``("client", id, "train", name)``; component ``i``
draws from ``("client", id, "train", name, "component", i)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.models import MODELS, create_model
from oneshotfl.models.base import Init
from oneshotfl.models.state import model_from_state
from oneshotfl.params import Params, require
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.components import (
    COMPONENTS,
    ComponentEnv,
    ComponentSpec,
    build_component,
    component_config,
)
from oneshotfl.training.loop import Batch, FitHooks, FitStats, TrainConfig, fit
from oneshotfl.training.progress import Tracker
from oneshotfl.training.pruning import MagnitudePruner, PruningSchedule


@dataclass(frozen=True)
class ClientRecipe(Params):
    """How one client trains its model; every field is part of the cache key.

    Attributes:
        arch: the model architecture (model registry name).
        train: optimiser, epochs, batch size (with ``pruning``, its epochs are replaced by
            the schedule's budget).
        name: names the recipe's random streams and its progress bar (``erm``, ``fedprox``).
        extra_outputs: outputs beyond the task's classes (1 for an abstention class).
        components: registered components added to cross-entropy, in order.
        pruning: iterative magnitude pruning inside the training budget.
    The model starts from the run's initialisation, ``train.init``.
    """

    arch: str
    train: TrainConfig
    name: str = "erm"
    extra_outputs: int = 0
    components: tuple[ComponentSpec, ...] = ()
    pruning: PruningSchedule | None = None

    def validate(self) -> None:
        require(self.extra_outputs >= 0, "extra_outputs", ">= 0", self.extra_outputs)
        require(bool(self.name), "name", "a non-empty recipe name", self.name)
        for spec in self.components:
            require(spec.name in COMPONENTS, "components", f"one of {COMPONENTS.names()}", spec)
            component_config(spec)  # a bad parameter fails here, before any training

    def key(self) -> dict[str, Any]:
        """The recipe as a JSON-able mapping (the artefact cache key), canonical: the epochs
        a pruning schedule replaces are the schedule's, and each component's parameters are
        its full, coerced config (``mu=1`` and ``mu=1.0`` are one key)."""
        key = dataclasses.asdict(self)
        key["train"]["epochs"] = self.epochs()
        key["components"] = [
            {
                "name": spec.name,
                "params": dataclasses.asdict(component_config(spec)),
                "epochs": [spec.start_epoch, spec.stop_epoch],
            }
            for spec in self.components
        ]
        return key

    def epochs(self) -> int:
        """The training budget in epochs."""
        return self.train.epochs if self.pruning is None else self.pruning.total_epochs


def initial_model(
    arch: str, task: TaskInfo, seed: int, extra_outputs: int = 0, init: Init = "he"
) -> nn.Module:
    """The shared initialisation of ``arch``: the same for every client with that architecture.

    One-shot FedAvg and FedProx assume the server broadcast one initial model; deriving it
    from the model seed and the architecture name gives every party the same weights
    (``init``: see :func:`oneshotfl.models.base.init_weights`). The weights are drawn once;
    the module is one :func:`recycle` took back when there is one (the drawn state loaded into
    it), else built without drawing — the same module either way, in training mode.
    """
    classes = task.num_classes + extra_outputs
    shape = (arch, MODELS.get(arch), task.in_channels, classes, task.image_size)
    key = (*shape, extra_outputs, seed, init)
    state = _INITIAL.get(key)
    if state is None:  # drawn once per run's architecture: thousands of clients share it
        with seeded_torch(seed, "init", arch, extra_outputs):
            model = create_model(arch, task.in_channels, classes, task.image_size, init)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if len(_INITIAL) >= 64:
            _INITIAL.pop(next(iter(_INITIAL)))
        _INITIAL[key] = state
    free = _FREE.get(shape)
    if free:  # a module a client trained and nobody holds: the initial state loaded into it
        reused = free.pop().cpu()
        reused.load_state_dict(state, strict=True)
        return as_built(reused).train()
    with torch.device("meta"):  # built without drawing weights, then given the drawn ones
        model = create_model(arch, task.in_channels, classes, task.image_size, init)
    model.load_state_dict({k: v.clone() for k, v in state.items()}, strict=True, assign=True)
    if any(t.is_meta for t in model.buffers()):  # a buffer outside the state: build it whole
        with seeded_torch(seed, "init", arch, extra_outputs):
            model = create_model(arch, task.in_channels, classes, task.image_size, init)
    return model


def recycle(model: nn.Module) -> None:
    """Hand :func:`initial_model` a module nobody holds any more (a client's trained model
    once its step is over), to load the next client's initial state into instead of building
    one: a process that plays thousands of clients builds a few modules per architecture.
    Only models with a persistent state alone (nothing :meth:`load_state_dict` would not
    reset) and no hooks are taken; a few are kept per architecture."""
    arch = getattr(model, "arch", None)
    if not isinstance(arch, str) or arch not in MODELS.names():
        return
    persistent = set(model.state_dict())
    named = [*model.named_parameters(), *model.named_buffers()]
    if any(name not in persistent for name, _ in named) or _has_hooks(model):
        return
    sizes = [getattr(model, k, None) for k in ("in_channels", "num_classes", "image_size")]
    shape = (arch, MODELS.get(arch), *sizes)
    free = _FREE.setdefault(shape, [])
    if len(free) < 4 and all(m is not model for m in free):
        free.append(model)


def module_from_state(
    arch: str,
    arrays: Mapping[str, np.ndarray],
    in_channels: int,
    num_classes: int,
    image_size: int,
) -> nn.Module:
    """The ``arch`` model holding the ``model.``-keyed ``arrays`` (a cached or offered
    artefact): a module :func:`recycle` took back with the state loaded into it (where it
    is: a move to the run's device is the caller's), else one built
    (:func:`~oneshotfl.models.state.model_from_state`) — the same values either way."""
    free = _FREE.get((arch, MODELS.get(arch), in_channels, num_classes, image_size))
    if not free:
        return model_from_state(arch, arrays, in_channels, num_classes, image_size)
    reused = free.pop()
    state = {
        k[len("model.") :]: torch.from_numpy(np.array(v))
        for k, v in arrays.items()
        if k.startswith("model.")
    }
    reused.load_state_dict(state, strict=True)
    return as_built(reused)


def as_built(model: nn.Module) -> nn.Module:
    """``model`` as a module built from its state would be: no gradients, every parameter
    trainable (a trained or recycled module reused in place of a build)."""
    for param in model.parameters():
        param.grad = None
        param.requires_grad_(True)
    return model


def _has_hooks(model: nn.Module) -> bool:
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
             "_load_state_dict_pre_hooks", "_backward_pre_hooks")  # fmt: skip
    return any(getattr(m, h, None) for m in model.modules() for h in hooks) or any(
        getattr(m, "parametrizations", None) for m in model.modules()
    )


_INITIAL: dict[tuple[object, ...], dict[str, torch.Tensor]] = {}
"""The initial states :func:`initial_model` drew, by architecture, task, seed and init."""

_FREE: dict[tuple[object, ...], list[nn.Module]] = {}
"""Modules :func:`recycle` took back, by architecture and sizes."""


@dataclass(frozen=True)
class RecipeResult:
    """A trained recipe: the model (on ``device``, eval mode) and what training did."""

    model: nn.Module
    stats: FitStats
    facts: Mapping[str, float] = field(default_factory=dict)


def train_recipe(
    recipe: ClientRecipe,
    data: LabelledData,
    task: TaskInfo,
    *,
    seed: int,
    client_id: int,
    device: torch.device,
    tracker: Tracker | None = None,
) -> RecipeResult:
    """Execute ``recipe`` on a client's data (see the module docs); no caching here."""
    model = initial_model(recipe.arch, task, seed, recipe.extra_outputs, recipe.train.init)
    components = [
        build_component(
            spec,
            ComponentEnv(
                task.num_classes,
                recipe.extra_outputs,
                torch_generator(seed, "client", client_id, "train", recipe.name, "component", i),
            ),
        )
        for i, spec in enumerate(recipe.components)
    ]
    for component in components:
        component.setup(model)
    pruner = None if recipe.pruning is None else MagnitudePruner(model, recipe.pruning)
    epoch = [0]

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        active = [
            c for c, s in zip(components, recipe.components, strict=True) if s.active(epoch[0])
        ]
        for component in active:
            extra = component.extra_examples(m, x, y)
            if extra is not None:
                x, y = torch.cat([x, extra[0]]), torch.cat([y, extra[1]])
        logits = m(x)
        loss = F.cross_entropy(logits, y)
        for component in active:
            term = component.loss_term(m, x, y, logits)
            if term is not None:
                loss = loss + term
        return loss

    def start(e: int) -> None:
        epoch[0] = e

    hooks = FitHooks(
        epoch_start=start,
        step_end=None if pruner is None else pruner.apply,
        epoch_end=None if pruner is None else pruner.on_epoch_end,
    )
    stats = fit(
        model,
        (data.x, data.y),
        loss_fn,
        dataclasses.replace(recipe.train, epochs=recipe.epochs()),
        torch_generator(seed, "client", client_id, "train", recipe.name),
        device,
        tracker,
        f"client {client_id} {recipe.name} ({recipe.arch})",
        hooks,
    )
    facts = {} if pruner is None else {"sparsity": pruner.sparsity()}
    return RecipeResult(model, stats, facts)
