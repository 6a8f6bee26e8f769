"""The model registry and the classifier contract every architecture follows.

The contract is timm's (Wightman, *PyTorch Image Models*, 2019): a model exposes
``num_features``, ``forward_features`` (pooled, flattened pre-logits features),
``forward_head`` (the linear classifier, skippable with ``pre_logits=True``) and
``forward = forward_head ∘ forward_features``. Head-based one-shot methods rely on the head being
a single :class:`torch.nn.Linear` named ``head``.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, Literal, TypeVar

import torch
from torch import nn

from oneshotfl.registry import Registry


def _as_size(what: str, value: object, minimum: int, owner: str) -> int:
    """``value`` as an ``int`` of at least ``minimum``, or a ``ValueError`` saying why not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{owner} expects {what} to be an integer, got {value!r} ({type(value).__name__})"
        )
    size = int(value)
    if size < minimum:
        raise ValueError(f"{owner} expects {what} >= {minimum}, got {size}")
    return size


class ClassifierModel(nn.Module, ABC):
    """Abstract image classifier: a feature extractor followed by one linear head.

    Subclasses build their trunk, then set :attr:`num_features` and ``head =
    nn.Linear(num_features, num_classes)`` and implement :meth:`forward_features`.

    Args:
        in_channels: channels of the input images (1 for greyscale, 3 for RGB).
        num_classes: outputs of the head; at least 1.
        image_size: height (= width) of the square input images in pixels; at least
            :attr:`min_image_size`.

    Attributes:
        arch: the registry name the model was built under (set by :func:`create_model`; empty
            for a model constructed directly).
        in_channels: as given.
        num_classes: as given.
        image_size: as given.
        num_features: width of the pre-logits features ``forward_features`` returns.
        head: the linear classifier mapping features to logits.

    Raises:
        ValueError: if a size is not an integer or is below its minimum.
    """

    min_image_size: ClassVar[int] = 1
    """The smallest input side length the architecture supports (its total down-sampling)."""

    unnormalised: ClassVar[bool] = False
    """No normalisation layer keeps its activations at unit scale: the weight initialisation
    (:data:`Init`) decides whether a signal reaches the head (see :func:`init_weights`)."""

    arch: str
    num_features: int
    head: nn.Linear

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        owner = type(self).__name__
        self.in_channels = _as_size("in_channels", in_channels, 1, owner)
        self.num_classes = _as_size("num_classes", num_classes, 1, owner)
        self.image_size = _as_size("image_size", image_size, self.min_image_size, owner)
        self.arch = ""

    @abstractmethod
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-logits features of a batch.

        Args:
            x: images ``[N, in_channels, image_size, image_size]``.

        Returns:
            Pooled, flattened features ``[N, num_features]``.
        """

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Apply the linear head.

        Args:
            features: output of :meth:`forward_features`, ``[N, num_features]``.
            pre_logits: return ``features`` unchanged instead of the logits.

        Returns:
            Logits ``[N, num_classes]``, or the features when ``pre_logits``.
        """
        if pre_logits:
            return features
        out: torch.Tensor = self.head(features)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, num_classes]`` of images ``[N, in_channels, image_size, image_size]``."""
        return self.forward_head(self.forward_features(x))

    def extra_repr(self) -> str:
        return (
            f"arch={self.arch!r}, in_channels={self.in_channels}, "
            f"num_classes={self.num_classes}, image_size={self.image_size}"
        )


Init = Literal["he", "torch"]
"""Weight initialisation of the unnormalised architectures (:func:`init_weights`)."""

INITS: tuple[Init, ...] = ("he", "torch")


def init_weights(model: ClassifierModel, init: Init) -> None:
    """Initialise an unnormalised architecture (``unnormalised``; others keep their own).

    ``torch`` keeps PyTorch's layer defaults: weights U(±1/√fan_in), i.e. a variance of
    1/(3·fan_in) — a ReLU layer passes on about 1/6 of its input's second moment, so the
    LeNet ``cnn``'s logits vary across 8×8 digits with a standard deviation of 0.005 at
    initialisation (0.33 for the BatchNorm ``simple_cnn2``) and the first steps move little
    but the output biases. ``he`` (He et al., ICCV 2015) draws every convolution and linear
    layer followed by a ReLU from N(0, 2/fan_in) and the head from N(0, 1/fan_in), biases 0,
    so the signal keeps its scale through depth and small budgets train.
    """
    if init not in INITS:
        raise ValueError(f"init: expected one of {', '.join(INITS)}, got {init!r}")
    if init == "torch" or not model.unnormalised:
        return
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            gain = 1.0 if module is model.head else 2.0
            std = math.sqrt(gain / module.weight[0].numel())
            with torch.no_grad():
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()


ModelFactory = Callable[[int, int, int], ClassifierModel]
"""What the registry holds: ``factory(in_channels, num_classes, image_size) -> model``."""

MODELS: Registry[ModelFactory] = Registry("model")


def create_model(
    name: str, in_channels: int, num_classes: int, image_size: int, init: Init = "he"
) -> ClassifierModel:
    """Build the architecture registered as ``name``.

    Weights are drawn from torch's global RNG (seed it, or use a forked RNG, around the call for
    reproducible initialisations). Works under ``with torch.device("meta"):``.

    Args:
        name: a registered model name (see :func:`list_models`).
        in_channels: channels of the input images.
        num_classes: number of classes (outputs of the head).
        image_size: side length of the square input images.
        init: the initialisation of an unnormalised architecture (:func:`init_weights`).

    Returns:
        The model, with ``arch`` set to ``name``.

    Raises:
        oneshotfl.registry.RegistryError: for an unknown name (the message lists known names).
        ValueError: for sizes the architecture cannot take.
    """
    if init not in INITS:
        raise ValueError(f"init: expected one of {', '.join(INITS)}, got {init!r}")
    factory = MODELS.get(name)
    try:
        model = factory(in_channels, num_classes, image_size)
    except ValueError as err:
        raise ValueError(f"cannot build model {name!r}: {err}") from err
    if not isinstance(model, ClassifierModel):
        raise TypeError(
            f"model factory {name!r} must return a ClassifierModel, got {type(model).__name__}"
        )
    model.arch = name
    if not _on_meta(model):
        init_weights(model, init)
    return model


def _on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def concrete(device: torch.device | str) -> torch.device:
    """``device`` as a tensor placed on it reports it: ``cuda`` is ``cuda:N`` for the current
    device N (``torch.device("cuda") != torch.device("cuda:0")``, though a tensor moved to
    the first is on the second)."""
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return want


def on_device(module: ModuleT, device: torch.device | str) -> ModuleT:
    """``module.to(device)``, skipped when every parameter and buffer is there already:
    walking a small module's tree to move nothing costs more than its forward pass on a few
    examples, and a client's model meets several such calls."""
    want = concrete(device)
    tensors = [*module.parameters(), *module.buffers()]
    if tensors and all(t.device == want for t in tensors):
        return module
    return module.to(want)


def list_models() -> list[str]:
    """All registered model names, sorted."""
    return MODELS.names()


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Side length after a convolution or pooling layer (no dilation, floor mode)."""
    return (size + 2 * padding - kernel) // stride + 1


def capped_pool(size: int, cap: int) -> tuple[nn.Module, int]:
    """Average-pool a ``size``x``size`` map down to at most ``cap``x``cap``.

    Keeps fully connected layers after a conv trunk the paper's size on small inputs while
    bounding them on large ones (e.g. 96x96 STL-10 images).

    Returns:
        The layer (``nn.Identity`` when ``size <= cap``) and the side length it outputs.
    """
    if size <= cap:
        return nn.Identity(), size
    return nn.AdaptiveAvgPool2d(cap), cap


def init_conv_bn(model: nn.Module, head: nn.Linear | None = None, head_std: float = 0.01) -> None:
    """He (fan-out) initialisation of convolutions, unit/zero BatchNorm affine parameters, and
    ``head`` (where given) from N(0, ``head_std``) with a zero bias.

    The initialisation of He et al. (2015) as torchvision's ResNet and VGG use it. A model
    on the meta device (shapes only) is left as it is: there is nothing to draw, and a normal
    draw on meta tensors would import torch's compiler (about 2 s of CPU in a fresh process).
    """
    if _on_meta(model):
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if head is not None:  # after the trunk: the draws keep their order
        nn.init.normal_(head.weight, 0.0, head_std)
        nn.init.zeros_(head.bias)
