"""torch's SGD, Adam and AdamW, without loading torch's compiler.

Every ``torch.optim`` optimiser imports ``torch._dynamo`` the first time one is built
(``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are wrapped by
``torch._disable_dynamo``, which imports it when first called) and in every ``step``
(``_use_grad_for_differentiable``). That import is about 2 CPU-seconds, paid once per
process: on a Flower deployment every message a node takes starts a new ClientApp process,
and this was a fifth of each one's cost. oneshotfl never compiles, so those guards do nothing
for it. These classes are torch's own, with the same ``__init__``, the same ``step`` body and
the same functional update (so the numbers are torch's, bit for bit: ``tests/test_optim.py``),
calling the undecorated methods instead (``inspect.unwrap``), and ``step`` under the grad mode
the decorator would set. Under ``torch.compile`` use ``torch.optim``'s own classes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast, overload

import torch
from torch.optim import Optimizer


def _eager(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without torch's compiler guards (the function they wrap)."""
    return cast(Callable[..., Any], inspect.unwrap(method))


_add_param_group = _eager(Optimizer.add_param_group)
_zero_grad = _eager(Optimizer.zero_grad)
_state_dict = _eager(Optimizer.state_dict)
_load_state_dict = _eager(Optimizer.load_state_dict)


class _EagerMixin:
    """The methods of :class:`torch.optim.Optimizer` that would import the compiler, eager."""

    _step: Callable[..., Any]  # the base class's undecorated step
    defaults: dict[str, Any]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _add_param_group(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _zero_grad(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return cast(dict[str, Any], _state_dict(self))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _load_state_dict(self, state_dict)

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update, exactly torch's (in the grad mode its decorator sets)."""
        with torch.set_grad_enabled(bool(self.defaults["differentiable"])):
            return cast(float | None, type(self)._step(self, closure))


class SGD(_EagerMixin, torch.optim.SGD):
    """:class:`torch.optim.SGD`, eager (see the module docs)."""

    _step = staticmethod(_eager(torch.optim.SGD.step))


class Adam(_EagerMixin, torch.optim.Adam):
    """:class:`torch.optim.Adam`, eager (see the module docs)."""

    _step = staticmethod(_eager(torch.optim.Adam.step))


class AdamW(_EagerMixin, torch.optim.AdamW):
    """:class:`torch.optim.AdamW`, eager (see the module docs)."""

    _step = staticmethod(_eager(torch.optim.AdamW.step))
