"""Streaming aggregation: a server step that is a sum over clients, one payload at a time.

A star method whose server step folds its payloads (FedAvg's weighted average, the Fisher and
RegMean sums, GH-OFL's statistics) returns a :class:`Fold` from
:meth:`~oneshotfl.protocol.contract.Method.fold`. The engine then folds each payload as soon
as it is decoded and validated, and drops it: n payloads are never held at once (issue 53).
A method whose server step needs every payload together (a median, a distillation over all
members, an ensemble) returns ``None``, the default, and says so in its ``cost``; the engine
then hands :meth:`~oneshotfl.protocol.contract.Method.aggregate` the payloads together.

The contract of a fold:

* payloads arrive in ascending client id, each already validated against the method's
  payload spec;
* :meth:`Fold.add` checks a payload before it changes anything: a payload it cannot take
  raises :class:`~oneshotfl.protocol.spec.PayloadError`, and the state stays what the
  payloads folded before made it; the engine then rejects that client, names it, and goes on;
* :meth:`Fold.finish` builds the outcome from what was folded (the engine checks the quorum
  first);
* folding every payload of a mapping in ascending id (:func:`fold_all`) is what the method's
  :meth:`~oneshotfl.protocol.contract.Method.aggregate` returns, to the bit: a method defines
  its ``aggregate`` through :func:`fold_all` where it can, so the two paths are one code;
* a subclass that overrides ``aggregate`` alone (a plugin that adds a step after FedAvg's
  average, say) keeps its ``aggregate``: the engine folds only where the fold is defined at
  or below the class that defines ``aggregate`` (:func:`uses_fold`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from oneshotfl.payload import Payload
from oneshotfl.protocol.outcome import Outcome


class Fold(ABC):
    """One server step folded over the clients' payloads (see the module docs)."""

    @abstractmethod
    def add(self, client_id: int, payload: Payload) -> None:
        """Fold in the validated payload of ``client_id`` (ascending ids).

        Raises:
            PayloadError: the payload cannot be folded (nothing folded before changes).
        """

    @abstractmethod
    def finish(self) -> Outcome:
        """The outcome of every payload folded so far (at least one)."""


def fold_all(fold: Fold, payloads: Mapping[int, Payload]) -> Outcome:
    """Fold every payload in ascending client id and finish: a foldable method's
    ``aggregate``."""
    for cid in sorted(payloads):
        fold.add(cid, payloads[cid])
    return fold.finish()


def uses_fold(method: Any) -> bool:
    """Whether ``method``'s server step is its fold: the fold is defined on the instance, or
    on a class at or below the one that defines ``aggregate`` (a subclass overriding only
    ``aggregate`` keeps it)."""
    own = vars(method) if hasattr(method, "__dict__") else {}
    if "fold" in own or "aggregate" in own:
        return "fold" in own
    mro = type(method).__mro__

    def owner(name: str) -> int:
        return next(i for i, cls in enumerate(mro) if name in vars(cls))

    return owner("fold") <= owner("aggregate")


__all__ = ["Fold", "fold_all", "uses_fold"]
