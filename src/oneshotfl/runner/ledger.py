"""The server's ledger: what each client reported about its own data.

In round 0 every client sends a :class:`ShardReport` (its training and validation sizes and
label counts) with its reply; the engine bounds it (:func:`shard_problem`) and enters the
first valid report of each client in the run's :class:`Ledger`, which the engine owns. The
result file's client rows and the label distributions personal accuracy is weighted by come
from the ledger only — the server counts no client's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oneshotfl.data.types import LabelledData
from oneshotfl.runner.evaluate import label_histogram


@dataclass(frozen=True)
class ShardReport:
    """What a client says about its own data, in round 0: the server's bookkeeping (client
    sizes and label histograms in the result file, the label distribution personal accuracy
    is weighted by) comes from these reports, never from a copy of the data. Self-reported:
    :func:`shard_problem` bounds it before anything is allocated or used.

    Attributes:
        train_size: training examples.
        val_size: validation examples.
        label_histogram: training examples per class, ``[classes]``.
    """

    train_size: int
    val_size: int
    label_histogram: tuple[int, ...]

    @classmethod
    def of(cls, train: LabelledData, val: LabelledData | None, num_classes: int) -> ShardReport:
        """The report of a shard (its clean labels)."""
        counts = label_histogram(train.y, num_classes)
        return cls(len(train), 0 if val is None else len(val), tuple(int(c) for c in counts))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the result file's client row fields)."""
        return {
            "train_size": self.train_size,
            "val_size": self.val_size,
            "label_histogram": list(self.label_histogram),
        }


def shard_problem(report: ShardReport | None, num_classes: int, max_examples: int) -> str | None:
    """Why a shard report cannot be used (``None``: it can): one count per class, integers
    ``>= 0`` summing to ``train_size``, and ``train_size + val_size <= N_max`` (when known)."""
    if report is None:
        return "sent no shard report (its training-set size and label counts)"
    counts = report.label_histogram
    if len(counts) != num_classes:
        return f"shard report: expected {num_classes} label counts, got {len(counts)}"
    sizes = (report.train_size, report.val_size, *counts)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes):
        return "shard report: expected integer sizes and label counts >= 0"
    if sum(counts) != report.train_size:
        return f"shard report: label counts sum to {sum(counts)}, train_size is {report.train_size}"
    total = report.train_size + report.val_size
    if max_examples > 0 and total > max_examples:
        return f"shard report: {total} examples, above N_max = {max_examples}"
    return None


@dataclass
class Ledger:
    """The clients' admitted :class:`ShardReport` s, by client id (the first valid report of
    each client), for one run."""

    clients: int
    classes: int
    reports: dict[int, ShardReport] = field(default_factory=dict)

    def admit(self, client_id: int, report: ShardReport) -> None:
        """Book ``report`` unless the client has one booked already."""
        self.reports.setdefault(client_id, report)

    def get(self, client_id: int) -> ShardReport | None:
        """Client ``client_id``'s booked report, if any."""
        return self.reports.get(client_id)

    def label_histograms(self) -> np.ndarray:
        """``[clients, classes]`` label counts as the clients reported them; NaN rows for
        clients that have not."""
        out = np.full((self.clients, self.classes), np.nan)
        for cid, report in self.reports.items():
            out[cid] = report.label_histogram
        return out
