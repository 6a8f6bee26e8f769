"""Choosing the compute device once, in the runner; and :class:`DeviceAudit`, which finds
tensors made off the run's device without a GPU."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda`` (or ``cuda:N``) into a ``torch.device``.

    Raises:
        ValueError: for an unknown choice, or ``cuda`` when no CUDA device is present.
    """
    if choice == "auto":
        return resolve_device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" or choice.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {choice!r} was asked for but torch sees no CUDA device; "
                "use --device cpu or --device auto"
            )
        deterministic_cudnn()
        return torch.device(choice)
    raise ValueError(f"unknown device {choice!r}; expected one of auto, cpu, cuda, cuda:N")


def deterministic_cudnn() -> None:
    """cuDNN picks the same convolution algorithms every run (no autotuning): a CUDA run, like
    a CPU one, then repeats itself on one machine."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


FACTORIES = frozenset(
    {
        torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.eye, torch.tensor,
        torch.as_tensor, torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace,
        torch.logspace,
    }
)  # fmt: skip
"""The tensor factories that place their result on the default device (the CPU) unless
they are told a ``device``."""

_PLACING = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.copy_})
_INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__})
"""Indexing a device tensor with CPU indices is allowed on every device."""
_PACKAGE = str(Path(__file__).resolve().parent)
_TORCH = (str(Path(torch.__file__).parent), str(Path(torch.__file__).resolve().parent))
"""torch's folder as imported and as resolved (a virtual environment reached by a symlink
names torch's frames by the link)."""


@dataclass(frozen=True)
class DeviceSlip:
    """A tensor made without a device that met a tensor of the run's device: on a GPU the
    operation would fail (``Expected all tensors to be on the same device``).

    Attributes:
        made: where the device-less tensor was made (``file:line in function``).
        met: the operation where it met the run's tensors, and where that was called.
    """

    made: str
    met: str

    def __str__(self) -> str:
        return f"a tensor made at {self.made} without a device met the run's tensors in {self.met}"


def _caller(roots: tuple[str, ...] = (_PACKAGE,)) -> str | None:
    """Where the first frame outside torch and this module is (``file:line in function``),
    when its code lies under one of ``roots``."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH) and name != __file__:
            if not name.startswith(roots):
                return None
            return f"{Path(name).name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


class DeviceAudit(TorchFunctionMode):
    """Finds device slips without a GPU (:class:`DeviceSlip`): while active, every tensor that
    oneshotfl's code makes with a factory (:data:`FACTORIES`) and no ``device`` is marked
    *homeless*, and so is what is computed from homeless tensors alone; an operation that
    mixes a homeless tensor of more than one element with another tensor is a slip — on a
    CPU run both sit on the CPU, on a GPU run one would not. Moving a tensor (``.to(device)``,
    ``.cuda()``, ``copy_``) gives it a home; indexing with homeless indices is allowed (every
    device takes CPU indices); a 0-dim tensor mixes with any device, as in torch. The audit
    only watches: results are bit-identical with and without it.

    Args:
        roots: folders whose code is audited (default: the oneshotfl package; a plugin's
            tests add their own).

    Attributes:
        slips: the slips seen, once per (made, met) pair, in order.
    """

    def __init__(self, roots: Sequence[str | Path] = ()) -> None:
        super().__init__()
        self.roots = (_PACKAGE, *(str(Path(r).resolve()) for r in roots))
        self.slips: list[DeviceSlip] = []
        self._homeless: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in FACTORIES:
            if (
                func in (torch.as_tensor, torch.tensor)
                and args
                and isinstance(args[0], torch.Tensor)
            ):
                return out  # on the tensor's own device
            if kwargs.get("device") is None and (site := _caller(self.roots)) is not None:
                self._mark(out, site)
            return out
        tensors = [t for t in _tensors((args, kwargs)) if t.dim() > 0]
        homes = [self._home(t) for t in tensors]
        if func in _PLACING:
            for t in _tensors(args[:1]):
                self._homeless.pop(id(t), None)
            return out
        if func in _INDEXING or not tensors or all(h is None for h in homes):
            return out
        if all(h is not None for h in homes):
            self._mark(out, str(homes[0]))
            return out
        made = next(str(h) for h in homes if h is not None)
        where = _caller(self.roots) or "torch"
        slip = DeviceSlip(made, f"{getattr(func, '__name__', func)} at {where}")
        if slip not in self.slips:
            self.slips.append(slip)
        return out

    def _home(self, t: torch.Tensor) -> str | None:
        """Where homeless ``t`` was made, else None (tensors are keyed by identity)."""
        entry = self._homeless.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _mark(self, out: Any, site: str) -> None:
        if len(self._homeless) > 100_000:  # forget the dead
            self._homeless = {k: v for k, v in self._homeless.items() if v[0]() is not None}
        for t in _tensors(out):
            self._homeless[id(t)] = (weakref.ref(t), site)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
