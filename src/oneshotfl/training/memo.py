"""Memoised test logits: one forward pass per distinct model over one evaluation input.

A federation's evaluation runs the same client models many times over the test set: ``local``,
both ``ensemble`` rows, ``peer_ensemble`` and every FOL reading decode the same uploads into
fresh modules and predict with them. Inside :func:`memoised_logits` ``(x)``,
:func:`~oneshotfl.training.loop.predict_logits` over that very tensor ``x`` looks its answer up
by the model's :func:`fingerprint` (its module classes, their plain settings and every
parameter and buffer, byte for byte) and computes it only the first time. The forward pass is
deterministic in eval mode, so the results are bit-identical to recomputing them; any other
input (public pools, training batches) is never memoised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from oneshotfl.fingerprints import tensor_fingerprint

_PLAIN = (bool, int, float, str, type(None))


def fingerprint(model: nn.Module) -> str:
    """A digest that two modules share only when they compute the same function in eval
    mode: every submodule's class, its plain (bool/int/float/str/None, and tuples of them)
    attributes, and the bytes, dtypes and shapes of its parameters and buffers."""
    digest = hashlib.blake2b(digest_size=20)
    for name, module in model.named_modules():
        kind = type(module)
        digest.update(f"{name}|{kind.__module__}.{kind.__qualname__}|".encode())
        for attr, value in sorted(vars(module).items()):
            if attr.startswith("_") or attr == "training":
                continue
            if isinstance(value, _PLAIN) or (
                isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)
            ):
                digest.update(f"{attr}={value!r};".encode())
        named = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        digest.update(";".join(n for n, _ in named).encode())
        digest.update(tensor_fingerprint(*(t for _, t in named)).encode())
    return digest.hexdigest()


@dataclass
class _Memo:
    x: torch.Tensor
    logits: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0


_ACTIVE: ContextVar[_Memo | None] = ContextVar("oneshotfl_logit_memo", default=None)


@dataclass(frozen=True)
class MemoStats:
    """How often the memo answered (``hits``) and how often it ran the model (``misses``)."""

    hits: int
    misses: int


def activate(x: torch.Tensor) -> None:
    """Memoise logits over ``x`` from now on in this context (a worker process's lifetime)."""
    _ACTIVE.set(_Memo(x))


@contextmanager
def memoised_logits(x: torch.Tensor) -> Iterator[Callable[[], MemoStats]]:
    """Within the block, logits over ``x`` (this tensor object) are computed once per model
    fingerprint, device and chunking. Yields a function that returns the counts so far."""
    memo = _Memo(x)
    token = _ACTIVE.set(memo)
    try:
        yield lambda: MemoStats(memo.hits, memo.misses)
    finally:
        _ACTIVE.reset(token)


def lookup(
    model: nn.Module, x: torch.Tensor, how: str, compute: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """``compute()``, memoised when a :func:`memoised_logits` block over ``x`` is active, by
    the model's fingerprint and ``how`` (the device and chunking); a copy is returned, so
    callers may change it freely."""
    memo = _ACTIVE.get()
    if memo is None or memo.x is not x:
        return compute()
    key = (fingerprint(model), how)
    if key not in memo.logits:
        memo.misses += 1
        memo.logits[key] = compute()
    else:
        memo.hits += 1
    return memo.logits[key].clone()


def lookup_many(
    models: list[nn.Module],
    x: torch.Tensor,
    how: str,
    compute: Callable[[list[nn.Module]], list[torch.Tensor]],
) -> list[torch.Tensor]:
    """:func:`lookup` for several models at once: ``compute`` runs once, on the models the
    memo does not hold (all of them when no memo over ``x`` is active)."""
    memo = _ACTIVE.get()
    if memo is None or memo.x is not x:
        return compute(models)
    keys = [(fingerprint(m), how) for m in models]
    missing = [i for i, k in enumerate(keys) if k not in memo.logits]
    if missing:
        for i, logits in zip(missing, compute([models[i] for i in missing]), strict=True):
            memo.logits[keys[i]] = logits
    memo.misses += len(missing)
    memo.hits += len(models) - len(missing)
    return [memo.logits[k].clone() for k in keys]


__all__ = ["MemoStats", "activate", "fingerprint", "lookup", "lookup_many", "memoised_logits"]
