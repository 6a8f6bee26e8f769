"""Class-set partitioners: each client holds whole classes (or equal shares of them).

``pathological`` (FedOL's #C classes per client), ``disjoint`` (FedOV/FedEOV's extreme
label skew) and ``skew`` (FOL's ψ: a fraction of each client's data from its dominant
classes). They follow the contract of :mod:`oneshotfl.data.partition` and register in
``PARTITIONERS`` (:mod:`oneshotfl.data.partition_base`) when :mod:`oneshotfl.data` is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oneshotfl.data.partition import _by_class, _check_int, _finish
from oneshotfl.data.partition_base import PARTITIONERS, Partitioner, _check_inputs


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


def integer_quotas(shares: np.ndarray, total: int) -> np.ndarray:
    """``shares`` (non-negative, summing to 1) as integers summing to ``total``: the floors,
    then one more for the largest remainders (ties to the lower index)."""
    exact = shares * total
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        out[np.argsort(-(exact - out), kind="stable")[:short]] += 1
    return out


@PARTITIONERS.register(
    "skew", "a fraction ψ of each client's data from its own #C dominant classes (FOL's ψ)"
)
@dataclass(frozen=True)
class Skew(Partitioner):
    """FOL's label skew ψ (Huang & Shu, "Federated Oriented Learning"). The paper varies ψ
    (0.7, 0.5, 0.3, 0.1) but our copy never defines it; we read it as: every client holds
    an equal share n = ⌊N/K⌋ of the data, of which a fraction ``psi`` comes from its own
    ``classes_per_client`` dominant classes (in equal parts) and the rest is spread uniformly
    over all C classes. So ψ = 0 is an IID split and ψ = 1 is the pathological #C split, and
    a client's dominant classes hold ψ + (1 − ψ)·#C/C of its data. The mixture of an IID share
    and a label-sorted share is the "similarity" split of SCAFFOLD (Karimireddy et al., ICML
    2020) with s = 1 − ψ.

    Dominant classes are dealt round-robin over a random class order, as ``pathological``
    does. Per-client quotas are rounded to integers that keep each client's total; when a
    class has fewer examples than its quotas ask, every client's quota of that class shrinks
    in proportion (those clients then hold a little less). Examples are dealt without
    replacement; unassigned examples stay unused.

    Attributes:
        psi: ψ in [0, 1].
        classes_per_client: #C dominant classes per client.
    """

    psi: float
    classes_per_client: int = 2

    def validate(self) -> None:
        if not 0.0 <= float(self.psi) <= 1.0:
            raise ValueError(f"psi: expected in [0, 1], got {self.psi}")
        _check_int("classes_per_client", self.classes_per_client, 1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        pools = _by_class(labels, rng)
        classes, per = len(pools), int(self.classes_per_client)
        if per > classes:
            raise ValueError(
                f"classes_per_client: expected at most the {classes} classes in the labels, "
                f"got {per}"
            )
        order = rng.permutation(classes)
        dominant = order[np.arange(num_clients * per) % classes].reshape(num_clients, per)
        shares = np.full((num_clients, classes), (1.0 - self.psi) / classes)
        np.add.at(shares, (np.arange(num_clients)[:, None], dominant), self.psi / per)
        size = len(labels) // num_clients
        quotas = np.stack([integer_quotas(row, size) for row in shares])  # [K, C]
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, pool in enumerate(pools):
            want = quotas[:, c]
            if want.sum() > len(pool):  # not enough of class c: every quota shrinks alike
                want = integer_quotas(want / want.sum(), len(pool))
            edges = np.concatenate([[0], np.cumsum(want)])
            for k in range(num_clients):
                parts[k].append(pool[edges[k] : edges[k + 1]])
        return _finish(parts)
