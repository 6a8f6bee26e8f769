"""Class-set partitioners: each client holds whole classes (or equal shares of them).

``pathological`` (FedOL's #C classes per client) and ``disjoint`` (FedOV/FedEOV's extreme
label skew). They follow the contract of :mod:`oneshotfl.data.partition` and register in its
``PARTITIONERS`` when :mod:`oneshotfl.data` is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oneshotfl.data.partition import (
    PARTITIONERS,
    Partitioner,
    _by_class,
    _check_inputs,
    _check_int,
    _finish,
)


@PARTITIONERS.register(
    "pathological", "#C classes per client, each class split equally among holders (FedOL)"
)
@dataclass(frozen=True)
class Pathological(Partitioner):
    """Pathological label skew #C as FedOL (Ye et al., "Towards a Larger Model via One-Shot
    Federated Learning on Heterogeneous Client Models") defines it: each client holds data of
    exactly ``classes_per_client`` distinct classes, and a class's examples are split equally
    (sizes differ by at most one) among the clients that hold it.

    Classes are dealt round-robin over a random class order: client k gets
    ``order[(k·#C + j) mod C]`` for j < #C. With #C ≤ C these are distinct, and every class is
    held by ⌊K·#C/C⌋ or ⌈K·#C/C⌉ clients, as even as possible. When K·#C ≥ C every example is
    assigned; when K·#C < C some classes go unused and their examples are not assigned.
    McMahan et al.'s (2017) sort-and-shard split is different: it deals equal-size shards of
    label-sorted data, so a client's shards may share a class and class shares are not equal.

    Attributes:
        classes_per_client: #C, at least 1 and at most the number of classes.
    """

    classes_per_client: int

    def validate(self) -> None:
        _check_int("classes_per_client", self.classes_per_client, 1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        pools = _by_class(labels, rng)
        per = int(self.classes_per_client)
        if per > len(pools):
            raise ValueError(
                f"classes_per_client: expected at most the {len(pools)} classes in the labels, "
                f"got {per}"
            )
        order = rng.permutation(len(pools))
        slots = order[np.arange(num_clients * per) % len(pools)].reshape(num_clients, per)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, pool in enumerate(pools):
            holders = np.flatnonzero((slots == c).any(axis=1))  # ascending client id
            if len(holders) == 0:
                continue  # K·#C < C: this class is dealt to no client
            for k, chunk in zip(holders, np.array_split(pool, len(holders)), strict=True):
                parts[k].append(chunk)
        return _finish(parts)


@PARTITIONERS.register("disjoint", "each client its own disjoint label set (FedOV/FedEOV extreme)")
@dataclass(frozen=True)
class Disjoint(Partitioner):
    """Disjoint label sets, the extreme label skew of FedOV (Diao, Li & He, ICLR 2023,
    "Towards Addressing Label Skews in One-Shot Federated Learning") and its extension FedEOV:
    no two clients share a class.

    The classes, in random order, are cut into K contiguous groups whose sizes differ by at
    most one; client k gets every example of group k (K ≤ C; the FedEOV code's
    ``XtremeHetero`` with contiguous class ids instead of a random order). With K > C (FedOV's
    ``noniid-#label1``, e.g. 20 clients on 10 classes) client k gets class π(k mod C) and each
    class's examples are split at random into equal parts among its clients; K must then be
    a multiple of C so that every class has as many holders. Every example is assigned.
    """

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        pools = _by_class(labels, rng)
        order = rng.permutation(len(pools))
        if num_clients <= len(pools):
            return _finish([[pools[c] for c in g] for g in np.array_split(order, num_clients)])
        if num_clients % len(pools):
            raise ValueError(
                f"disjoint: expected at most {len(pools)} clients or a multiple of {len(pools)} "
                f"(the classes present), got {num_clients}"
            )
        share = num_clients // len(pools)
        parts = [np.array_split(pools[c], share) for c in order]
        return _finish([[parts[k % len(pools)][k // len(pools)]] for k in range(num_clients)])
