"""Training components: what a client recipe adds to cross-entropy.

A component is registered by name (:data:`COMPONENTS`) and configured by a frozen
:class:`~oneshotfl.params.Params` dataclass; a recipe lists components as
:class:`ComponentSpec` values (name, parameters, active epochs), so recipes stay hashable
cache keys. Hooks (override what is needed): ``setup`` sees the initial model,
``extra_examples`` appends labelled examples to a batch (adversarial examples, augmented
negatives, …), ``loss_term`` adds a term (a proximal penalty, a regulariser). A method
module may register its own components next to the method.

Built in: ``proximal`` (FedProx), ``adversarial`` (FGSM / iterative FGSM examples) and
``augmented`` (an augmentation stream: noise, flip, shift, erase); the last two label their
examples with the true class (adversarial training, data augmentation) or with the extra
"unknown" class (open-set negatives, as FedOV's clients train on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.params import Params, coerce_params, require
from oneshotfl.registry import Registry

Scalar = int | float | str | bool


@dataclass(frozen=True)
class ComponentSpec:
    """A registered training component with its parameters and active epochs.

    Attributes:
        name: the component's registry name.
        params: its parameters, as sorted ``(key, value)`` pairs (hashable, a cache key).
        start_epoch: first 0-based epoch in which it is active.
        stop_epoch: first epoch in which it is no longer active (``None``: to the end).
    """

    name: str
    params: tuple[tuple[str, Scalar], ...] = ()
    start_epoch: int = 0
    stop_epoch: int | None = None

    @classmethod
    def of(
        cls, name: str, *, start_epoch: int = 0, stop_epoch: int | None = None, **params: Scalar
    ) -> ComponentSpec:
        """``ComponentSpec.of("proximal", mu=0.01)``."""
        return cls(name, tuple(sorted(params.items())), start_epoch, stop_epoch)

    def active(self, epoch: int) -> bool:
        return self.start_epoch <= epoch and (self.stop_epoch is None or epoch < self.stop_epoch)


@dataclass(frozen=True)
class ComponentEnv:
    """What a component may know: the task's class count, the extra outputs, its stream."""

    num_classes: int
    extra_outputs: int
    generator: torch.Generator = field(compare=False)


@dataclass(frozen=True)
class NoParams(Params):
    """A component without parameters."""


class Component:
    """Base of registered training components; override the hooks a component needs.

    Class attributes:
        Config: the component's frozen parameter dataclass (built from the spec's params).
    """

    Config: ClassVar[type] = NoParams

    def __init__(self, config: Any, env: ComponentEnv) -> None:
        self.config = config
        self.env = env

    def setup(self, model: nn.Module) -> None:
        """Called once with the freshly initialised model, before training."""

    def extra_examples(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Labelled examples appended to the batch (``None``: none this step)."""
        return None

    def loss_term(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor | None:
        """A term added to the loss (``None``: none)."""
        return None


COMPONENTS: Registry[type[Component]] = Registry("training component")


def register_component(name: str, description: str = "") -> Any:
    """Class decorator registering a :class:`Component` subclass."""
    return COMPONENTS.register(name, description)


def component_config(spec: ComponentSpec) -> Any:
    """The component's frozen config built from the spec's parameters.

    Raises:
        ValueError: for an unknown parameter or a value out of range.
    """
    try:
        return coerce_params(COMPONENTS.get(spec.name).Config, dict(spec.params))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"component {spec.name!r}: {exc}") from None


def build_component(spec: ComponentSpec, env: ComponentEnv) -> Component:
    """Instantiate a registered component from its spec (see :func:`component_config`)."""
    return COMPONENTS.get(spec.name)(component_config(spec), env)


@dataclass(frozen=True)
class ProximalConfig(Params):
    """Parameters of the proximal term.

    Attributes:
        mu: weight μ of (μ/2)·‖w − w0‖²; > 0.
    """

    mu: float = 0.01

    def validate(self) -> None:
        require(self.mu > 0, "mu", "> 0", self.mu)


def proximal_penalty(
    params: list[torch.Tensor], anchor: list[torch.Tensor], mu: float
) -> torch.Tensor:
    """(μ/2)·Σ_i ‖p_i − a_i‖² over aligned parameter tensors (gradients flow into ``params``).

    Raises:
        ValueError: when the two sequences differ in length or a pair differs in shape.
    """
    if len(params) != len(anchor):
        raise ValueError(
            f"proximal_penalty: expected as many anchor tensors as parameters ({len(params)}), "
            f"got {len(anchor)}"
        )
    if not params:
        return torch.zeros(())
    total = params[0].new_zeros(())
    for p, a in zip(params, anchor, strict=True):
        if p.shape != a.shape:
            raise ValueError(
                f"proximal_penalty: expected anchor shape {tuple(p.shape)}, got {tuple(a.shape)}"
            )
        total = total + (p - a.to(p.device, p.dtype)).pow(2).sum()
    return 0.5 * mu * total


@register_component("proximal", "FedProx's (μ/2)·‖w − w0‖² to the initial weights")
class Proximal(Component):
    """FedProx's proximal term (Li et al. 2020, Eq. 2) anchored at the initial model w0:
    trainable parameters only (buffers such as BatchNorm statistics are not optimised)."""

    Config = ProximalConfig

    def setup(self, model: nn.Module) -> None:
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in trainable]
        self.anchor = {n: p.detach().clone() for n, p in trainable}

    def loss_term(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor:
        current = dict(model.named_parameters())
        for n in self.names:  # the anchor follows the model to its device once
            if self.anchor[n].device != current[n].device:
                self.anchor[n] = self.anchor[n].to(current[n].device)
        return proximal_penalty(
            [current[n] for n in self.names], [self.anchor[n] for n in self.names], self.config.mu
        )


@dataclass(frozen=True)
class AdversarialConfig(Params):
    """Parameters of adversarial examples.

    Attributes:
        epsilon: L∞ budget in (normalised) input units; > 0.
        steps: gradient-sign steps of size ε/steps (1 = FGSM; more = iterative FGSM).
        label: ``true`` keeps each example's label (adversarial training); ``unknown`` labels
            it with the first extra output, class index C (open-set negatives; needs
            ``extra_outputs >= 1``).
        fraction: share of each batch turned into adversarial examples, in (0, 1].
    """

    epsilon: float = 0.1
    steps: int = 1
    label: Literal["true", "unknown"] = "true"
    fraction: float = 1.0

    def validate(self) -> None:
        require(self.epsilon > 0, "epsilon", "> 0", self.epsilon)
        require(self.steps >= 1, "steps", ">= 1", self.steps)
        require(0 < self.fraction <= 1, "fraction", "in (0, 1]", self.fraction)


def sign_gradient_steps(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    step: float,
    steps: int,
    epsilon: float,
    targeted: bool = False,
) -> torch.Tensor:
    """x' = Π_{‖x'−x‖∞≤ε}(x' ± step·sign(∇_x' CE(f(x'), y))), ``steps`` times from x: ``+``
    raises the loss of ``y`` (untargeted FGSM), ``−`` with ``targeted`` lowers it (a targeted
    attack towards ``y``). Gradients reach the input only."""
    sign = -1.0 if targeted else 1.0
    adv = x.detach().clone()
    for _ in range(steps):
        adv.requires_grad_(True)
        loss = F.cross_entropy(model(adv), y)
        (grad,) = torch.autograd.grad(loss, adv)
        adv = adv.detach() + sign * step * grad.sign()
        adv = x.detach() + (adv - x.detach()).clamp(-epsilon, epsilon)
    return adv.detach()


def gradient_sign_examples(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilon: float, steps: int
) -> torch.Tensor:
    """Untargeted :func:`sign_gradient_steps` of size ε/steps (Goodfellow et al. 2015's FGSM
    for one step)."""
    return sign_gradient_steps(model, x, y, step=epsilon / steps, steps=steps, epsilon=epsilon)


@register_component("adversarial", "FGSM / iterative FGSM examples (true or 'unknown' label)")
class Adversarial(Component):
    """Adversarial examples appended to every batch. They are generated with the model in
    eval mode (BatchNorm running statistics are not disturbed by the attack's forward
    passes), from a random ``fraction`` of the batch drawn from the component's stream."""

    Config = AdversarialConfig

    def setup(self, model: nn.Module) -> None:
        require_unknown_output("adversarial", self.config.label, self.env)

    def extra_examples(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        pick = _pick(len(x), cfg.fraction, self.env.generator).to(x.device)
        was_training = model.training
        model.eval()
        adv = gradient_sign_examples(model, x[pick], y[pick], cfg.epsilon, cfg.steps)
        model.train(was_training)
        return adv, _labels(y[pick], cfg.label, self.env)


@dataclass(frozen=True)
class AugmentedConfig(Params):
    """Parameters of an augmentation stream.

    Attributes:
        transform: ``noise`` (add N(0, strength²)), ``flip`` (mirror left-right), ``shift``
            (translate by up to ``strength`` pixels in each direction, zero fill) or
            ``erase`` (zero a random square of side ``strength`` × the image side).
        strength: the transform's size (see ``transform``); > 0.
        label: ``true`` keeps each example's label (data augmentation); ``unknown`` labels
            it with class index C (augmented negatives of an abstention class).
        fraction: share of each batch that is augmented and appended, in (0, 1].
    """

    transform: Literal["noise", "flip", "shift", "erase"] = "noise"
    strength: float = 0.1
    label: Literal["true", "unknown"] = "true"
    fraction: float = 1.0

    def validate(self) -> None:
        require(self.strength > 0, "strength", "> 0", self.strength)
        require(0 < self.fraction <= 1, "fraction", "in (0, 1]", self.fraction)


def augment_images(
    x: torch.Tensor, transform: str, strength: float, generator: torch.Generator
) -> torch.Tensor:
    """One of :class:`AugmentedConfig`'s transforms on ``[B, C, H, W]`` images; every random
    choice comes from ``generator`` (a CPU stream), so the result is seeded."""
    b, _, h, w = x.shape
    if transform == "noise":
        return x + strength * torch.randn(x.shape, generator=generator).to(x.device, x.dtype)
    if transform == "flip":
        return x.flip(-1)
    if transform == "shift":
        k = max(1, round(strength))
        moves = torch.randint(-k, k + 1, (b, 2), generator=generator).tolist()
        out = torch.zeros_like(x)
        for i, (dy, dx) in enumerate(moves):
            ys, yd = slice(max(0, -dy), h - max(0, dy)), slice(max(0, dy), h - max(0, -dy))
            xs, xd = slice(max(0, -dx), w - max(0, dx)), slice(max(0, dx), w - max(0, -dx))
            out[i, :, yd, xd] = x[i, :, ys, xs]
        return out
    side = max(1, min(h, w, round(strength * min(h, w))))
    corners = torch.randint(0, min(h, w) - side + 1, (b, 2), generator=generator).tolist()
    out = x.clone()
    for i, (top, left) in enumerate(corners):
        out[i, :, top : top + side, left : left + side] = 0
    return out


@register_component("augmented", "an augmentation stream (noise, flip, shift, erase)")
class Augmented(Component):
    """Augmented copies of a random ``fraction`` of each batch, appended to it, labelled with
    their own class or with the extra "unknown" class."""

    Config = AugmentedConfig

    def setup(self, model: nn.Module) -> None:
        require_unknown_output("augmented", self.config.label, self.env)

    def extra_examples(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        pick = _pick(len(x), cfg.fraction, self.env.generator).to(x.device)
        out = augment_images(x[pick], cfg.transform, cfg.strength, self.env.generator)
        return out, _labels(y[pick], cfg.label, self.env)


def _pick(n: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """A random ``fraction`` (at least one) of ``n`` batch rows."""
    return torch.randperm(n, generator=generator)[: max(1, round(fraction * n))]


def _labels(y: torch.Tensor, label: str, env: ComponentEnv) -> torch.Tensor:
    return torch.full_like(y, env.num_classes) if label == "unknown" else y


def require_unknown_output(name: str, label: str, env: ComponentEnv) -> None:
    if label == "unknown" and env.extra_outputs < 1:
        raise ValueError(
            f"component {name!r}: label=unknown needs a recipe with extra_outputs >= 1, "
            f"got {env.extra_outputs}"
        )
