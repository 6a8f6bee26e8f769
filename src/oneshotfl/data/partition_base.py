"""The partitioner contract: the :class:`Partitioner` base every split follows (see
:mod:`oneshotfl.data.partition`), the ``PARTITIONERS`` registry, :class:`PartitionError`, the
argument checks every ``split`` starts with, and the prefix of a Flower Datasets partitioner's
name. The partitioners are in :mod:`oneshotfl.data.partition`,
:mod:`oneshotfl.data.partition_sets` and :mod:`oneshotfl.data.flwr_partition`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from oneshotfl.params import Params
from oneshotfl.registry import Registry


class PartitionError(ValueError):
    """A partition that cannot satisfy its constraints (e.g. ``min_samples`` at tiny α)."""


@dataclass(frozen=True)
class Partitioner(Params):
    """Base of every partitioner: splits sample indices over clients by label."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels``' indices over ``num_clients`` clients.

        Args:
            labels: ``[N]`` non-negative integer class labels.
            num_clients: K >= 1.
            rng: the generator to draw from (and advance).

        Returns:
            K sorted ``int64`` index arrays into ``labels``, pairwise disjoint.

        Raises:
            ValueError: for bad arguments.
            PartitionError: when the constraints cannot be met.
        """
        raise NotImplementedError


PARTITIONERS: Registry[type[Partitioner]] = Registry("partitioner")


# --------------------------------------------------------------------------- validation


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_inputs(labels: np.ndarray, num_clients: int) -> np.ndarray:
    """Validate the arguments of ``split``; return the labels as an int64 vector."""
    if not _is_int(num_clients) or num_clients < 1:
        raise ValueError(f"num_clients: expected an integer >= 1, got {num_clients!r}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise ValueError(
            f"labels: expected a 1-D integer array, got {labels.dtype} of shape {labels.shape}"
        )
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels: expected non-negative class ids, got {labels.min()}")
    if num_clients > len(labels):
        raise PartitionError(
            f"num_clients: expected at most the {len(labels)} examples, got {num_clients}"
        )
    return labels.astype(np.int64, copy=False)


FLWR_PREFIX = "flwr:"
"""How a partition name marks a Flower Datasets partitioner class."""
