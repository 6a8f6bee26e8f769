"""Known limits: where a method is expected to end below a reference, and why.

The robustness matrix (``make bench-robustness``; ``scripts/robustness_report.py``) runs every
registered method on several datasets, models and partitions and names every cell where a
method ends below training alone (``local``) or the plain ensemble of the same client models
(``ensemble``). Each such cell is either fixed or covered by one of the method's
:class:`KnownLimit` s, which ``oneshotfl describe`` prints; the report fails on a cell that
no limit covers, so the list stays true as methods change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Reference = Literal["local", "ensemble"]
REFERENCES: tuple[Reference, ...] = ("local", "ensemble")


@dataclass(frozen=True)
class KnownLimit:
    """A documented reason for a method to end below a reference in some settings.

    Attributes:
        why: the reason, measured (what the matrix shows and what causes it).
        below: the references the method may end below there.
        datasets: the dataset labels it covers (``digits``, ``fashion_mnist``, an npz file's
            stem such as ``shapes16``); empty: every dataset.
        models: the client architectures it covers; empty: every model.
        partitions: the partitioners it covers; empty: every partition.
        options: method options the limit is about (``combine=logits``): it covers a spec
            only when it sets every one of them.
        bound: a method whose result bounds this one (FedAGE: ``centralized_head``, one head
            on every client's embeddings and true labels): the limit covers a cell only where
            the bound is itself below the reference there, so the cause is checked per cell.
        weak_clients: the cause is the method's own client models (FedAGE: the frozen encoder
            plus each client's head): the limit covers a cell only where their mean test
            accuracy is below that of the plain client models (``local``) there.
    """

    why: str
    below: tuple[Reference, ...] = ("ensemble",)
    datasets: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    bound: str | None = None
    weak_clients: bool = False

    def __post_init__(self) -> None:
        unknown = [r for r in self.below if r not in REFERENCES]
        if not self.below or unknown:
            raise ValueError(f"KnownLimit.below: expected some of {REFERENCES}, got {self.below}")

    def covers(
        self, reference: str, dataset: str, model: str, partition: str, options: str = ""
    ) -> bool:
        """Whether this limit explains ending below ``reference`` in that setting, for a spec
        whose options are ``options`` (``key=value:key=value``; the bound is checked by the
        caller, who has the results)."""
        given = set(options.split(":")) if options else set()
        return (
            reference in self.below
            and (not self.datasets or dataset in self.datasets)
            and (not self.models or model in self.models)
            and (not self.partitions or partition in self.partitions)
            and set(self.options) <= given
        )

    def scope(self) -> str:
        """Where it applies, in words: ``below ensemble; digits; cnn, mlp; every partition``."""
        parts = [
            ", ".join(values) if values else f"every {what}"
            for what, values in (
                ("dataset", self.datasets),
                ("model", self.models),
                ("partition", self.partitions),
            )
        ]
        extra = [f"with {', '.join(self.options)}"] if self.options else []
        if self.bound:
            extra.append(f"where `{self.bound}` is below too")
        if self.weak_clients:
            extra.append("where its client models are below `local`'s")
        return f"below {' and '.join(self.below)}; " + "; ".join([*parts, *extra])
