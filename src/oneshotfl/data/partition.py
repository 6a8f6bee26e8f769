"""Label-skew partitioners: pure, seeded, vectorised, each citing the paper it follows.

A partitioner is a frozen dataclass validated on construction (a bad parameter raises
``ValueError`` naming what was expected and what was got). ``split(labels, num_clients, rng)``
returns one sorted ``int64`` array per client of indices into ``labels``; no index appears
twice. It draws only from the ``numpy.random.Generator`` it is given (the partition-seed
stream), never from global state, so the same generator state gives the same split. Work is
vectorised per class; the only loops run over classes, clients or a bounded number of retries
(at most ``max_retries`` draws, at most C+1 renormalisation rounds per client), so no
partitioner can hang at small α.

Labels are non-negative integers; the classes are those present in ``labels`` (a class absent
from a subset simply takes no part). The base class, the registry and the argument checks are
in :mod:`oneshotfl.data.partition_base`; the class-set partitioners (``pathological``,
``disjoint``) live in :mod:`oneshotfl.data.partition_sets`.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from oneshotfl.data.partition_base import (
    FLWR_PREFIX,
    PARTITIONERS,
    Partitioner,
    PartitionError,
    _check_inputs,
)

# --------------------------------------------------------------------------- validation


def _check_alpha(alpha: object) -> None:
    if not (
        isinstance(alpha, numbers.Real)
        and not isinstance(alpha, bool)
        and np.isfinite(float(alpha))
        and float(alpha) > 0
    ):
        raise ValueError(f"alpha: expected a finite number > 0, got {alpha!r}")


def _check_int(name: str, value: object, least: int) -> None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least
    if not ok:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")


def _by_class(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """For each class present (ascending id), its sample indices in random order.

    One ``rng.permutation`` per class, in class order: the draw sequence every partitioner
    here depends on.
    """
    return [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]


def _finish(parts: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Concatenate each client's chunks into one sorted int64 array."""
    return [
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.empty(0, np.int64) for p in parts
    ]


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """The ``[num_clients, num_classes]`` matrix of example counts per client and class.

    Args:
        labels: ``[N]`` class labels in ``0..num_classes-1``.
        parts: one index array into ``labels`` per client.
        num_classes: the number of columns.

    Raises:
        ValueError: when a label is outside ``0..num_classes-1``.
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels: expected values in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}"
        )
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for k, p in enumerate(parts):
        counts[k] = np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return counts


# --------------------------------------------------------------------------- partitioners


@PARTITIONERS.register("iid", "uniformly random, equal-size shards")
@dataclass(frozen=True)
class IID(Partitioner):
    """Uniform random split into equal-size shards (the IID setting of McMahan et al. 2017,
    "Communication-Efficient Learning of Deep Networks from Decentralized Data").

    One permutation of all indices is cut into K shards whose sizes differ by at most one.
    Every example is assigned.
    """

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        shards = np.array_split(rng.permutation(len(labels)), num_clients)
        return [np.sort(p).astype(np.int64) for p in shards]


@PARTITIONERS.register("dirichlet", "per class, Dir(α) proportions over clients (NIID-Bench)")
@dataclass(frozen=True)
class Dirichlet(Partitioner):
    """Per-class Dirichlet label skew, as defined by Li et al. 2022, "Federated Learning on
    Non-IID Data Silos: An Experimental Study" (NIID-Bench, ICDE 2022); the split used by
    FedAGE and IntactOFL.

    For each class c, proportions p_c ~ Dir(α·1_K) over the K clients; the class's shuffled
    examples are cut at ⌊cumsum(p_c)·n_c⌋. Every example is assigned. The whole split is
    drawn again until every client holds at least ``min_samples`` examples (NIID-Bench's
    ``min_require_size``, 10 there too), at most ``max_retries`` times, then
    :class:`PartitionError`. NIID-Bench's code also zeroes the share of clients already holding
    more than N/K examples; we do not (it pulls the split away from Dir(α)), which is why
    retries can be needed at very small α.

    Attributes:
        alpha: the concentration α > 0; smaller means more skew.
        min_samples: least examples per client.
        max_retries: draws before giving up.
    """

    alpha: float
    min_samples: int = 10
    max_retries: int = 100

    def validate(self) -> None:
        _check_alpha(self.alpha)
        _check_int("min_samples", self.min_samples, 0)
        _check_int("max_retries", self.max_retries, 1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        if self.min_samples * num_clients > len(labels):
            raise PartitionError(
                f"dirichlet: min_samples={self.min_samples} × {num_clients} clients needs "
                f"at least {self.min_samples * num_clients} examples, got {len(labels)}; "
                "use a smaller min_samples or fewer clients"
            )
        smallest = 0
        for _ in range(self.max_retries):
            parts = self._draw(labels, num_clients, rng)
            smallest = min(len(p) for p in parts)
            if smallest >= self.min_samples:
                return parts
        raise PartitionError(
            f"dirichlet(alpha={self.alpha}): after {self.max_retries} draws the smallest client "
            f"still had {smallest} examples, expected >= min_samples={self.min_samples}; "
            "use a larger alpha or a smaller min_samples"
        )

    def _draw(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in _by_class(labels, rng):
            p = rng.dirichlet(np.full(num_clients, float(self.alpha)))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        return _finish(parts)


@PARTITIONERS.register(
    "dirichlet_client", "per client, Dir(α) over classes, equal sizes (Co-Boosting/FedCVAE)"
)
@dataclass(frozen=True)
class DirichletClient(Partitioner):
    """Per-client Dirichlet label skew with equal client sizes, the form used by Co-Boosting
    (Dai et al., ICLR 2024, "Enhancing One-Shot Federated Learning Through Data and Ensemble
    Co-Boosting") and FedCVAE (Heinbaugh et al., ICLR 2023, "Data-Free One-Shot Federated
    Learning Under Very High Statistical Heterogeneity").

    Client k (in order 0..K−1) draws q_k ~ Dir(α·1_C) over the classes present and receives
    ⌊N/K⌋ examples sampled without replacement: class counts ~ Multinomial(⌊N/K⌋, q_k), each
    capped at what is left of the class. When a class runs out, its mass is renormalised over
    the classes that still have examples and the shortfall is drawn again. Each such round
    either completes the client or empties at least one class, so a client needs at most C+1
    rounds (a bounded loop, each round vectorised over classes). If q_k puts no mass on any
    class left, the shortfall is drawn uniformly over those classes. Later clients can thus
    get a flatter mix than their q_k when classes are exhausted. The N − K·⌊N/K⌋ examples left
    over by the rounding are not assigned; every example is used at most once.

    Attributes:
        alpha: the concentration α > 0; smaller means fewer classes per client.
        min_samples: least examples per client (checked against ⌊N/K⌋).
    """

    alpha: float
    min_samples: int = 10

    def validate(self) -> None:
        _check_alpha(self.alpha)
        _check_int("min_samples", self.min_samples, 0)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        labels = _check_inputs(labels, num_clients)
        size = len(labels) // num_clients
        if size < self.min_samples:
            raise PartitionError(
                f"dirichlet_client: {len(labels)} examples over {num_clients} clients gives "
                f"{size} each, expected >= min_samples={self.min_samples}; "
                "use a smaller min_samples or fewer clients"
            )
        pools = _by_class(labels, rng)
        remaining = np.array([len(p) for p in pools], dtype=np.int64)
        taken = np.zeros(len(pools), dtype=np.int64)
        parts: list[list[np.ndarray]] = []
        for _ in range(num_clients):
            q = rng.dirichlet(np.full(len(pools), float(self.alpha)))
            counts = self._counts(q, size, remaining, rng)
            parts.append([pools[c][taken[c] : taken[c] + n] for c, n in enumerate(counts) if n])
            taken += counts
            remaining -= counts
        return _finish(parts)

    @staticmethod
    def _counts(
        q: np.ndarray, size: int, remaining: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Per-class counts summing to ``size`` (``remaining.sum() >= size``), capped."""
        counts = np.zeros_like(remaining)
        need = size
        for _ in range(len(remaining) + 1):
            avail = remaining - counts
            if need == 0 or avail.sum() == 0:
                break
            w = q * (avail > 0)
            w = w / w.sum() if w.sum() > 0 else (avail > 0) / (avail > 0).sum()
            draw = np.minimum(rng.multinomial(need, w), avail)
            counts += draw
            need -= int(draw.sum())
        return counts


# --------------------------------------------------------------------------- factory


def make_partitioner(name: str, **options: Any) -> Partitioner:
    """Build the partitioner ``name`` from those ``options`` its dataclass declares; a name
    ``flwr:ClassName[:key=value...]`` builds a Flower Datasets partitioner
    (:mod:`oneshotfl.data.flwr_partition`).

    Options it does not declare are ignored, so callers may pass every partition option
    (``alpha``, ``classes_per_client``, ``min_samples``, ``max_retries``) at once; ``None``
    means "use the default".

    Args:
        name: registry name (see ``PARTITIONERS.names()``).
        **options: candidate field values.

    Raises:
        RegistryError: for an unknown name.
        ValueError: when a required option is missing or a value is invalid.
    """
    if name.startswith(FLWR_PREFIX):  # a Flower Datasets partitioner (the flwr-datasets extra)
        from oneshotfl.data.flwr_partition import FlowerPartitioner

        return FlowerPartitioner.from_spec(name, options.get("alpha"))
    cls = PARTITIONERS.get(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in options.items() if k in fields and v is not None}
    missing = [
        f.name
        for f in fields.values()
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(
            f"partitioner {name!r}: expected a value for {', '.join(missing)}, got none"
        )
    return cls(**kwargs)
