"""Label-skew partitioners: pure, seeded, vectorised, each citing the paper it follows.

A partitioner is a frozen dataclass validated on construction; ``split(labels, num_clients,
rng)`` returns one sorted ``int64`` index array per client. It draws only from the
``numpy.random.Generator`` it is given (the partition-seed stream), never from global state,
and every loop in it is bounded, so it cannot hang at small α.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from oneshotfl.registry import Registry


class PartitionError(ValueError):
    """A partition that cannot satisfy its constraints (e.g. min_samples at tiny α)."""


class Partitioner(Protocol):
    """Splits sample indices over clients by label."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]: ...


PARTITIONERS: Registry[type[Any]] = Registry("partitioner")


def _check_clients(num_clients: int, n: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients: expected >= 1, got {num_clients}")
    if num_clients > n:
        raise PartitionError(f"cannot split {n} examples over {num_clients} clients")


def _by_class(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Per class (0..C-1), its sample indices in random order."""
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]


def _finish(parts: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.empty(0, np.int64) for p in parts
    ]


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """The ``[clients, classes]`` matrix of example counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


@PARTITIONERS.register("iid", "uniformly random, equal-size shards")
@dataclass(frozen=True)
class IID:
    """Uniform random split into equal-size shards (McMahan et al. 2017, the IID setting)."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        _check_clients(num_clients, len(labels))
        return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def _positive_alpha(alpha: float) -> None:
    if not (isinstance(alpha, int | float) and alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha: expected a finite number > 0, got {alpha!r}")


@PARTITIONERS.register("dirichlet", "per class, Dir(α) proportions over clients (NIID-Bench)")
@dataclass(frozen=True)
class Dirichlet:
    """Per-class Dirichlet label skew (Li et al. 2022, "Federated Learning on Non-IID Data
    Silos: An Experimental Study", NIID-Bench; used by FedAGE and IntactOFL).

    For each class c, proportions p_c ~ Dir(α·1_K) over the K clients; the class's shuffled
    examples are cut at ⌊cumsum(p_c)·n_c⌋. Every example is assigned. The whole draw is
    repeated until every client holds at least ``min_samples`` examples, at most
    ``max_retries`` times. NIID-Bench's code additionally zeroes the share of clients that
    already hold more than N/K examples; we do not (it changes the distribution away from
    Dir(α)), which is why retries can be needed at very small α.

    Attributes:
        alpha: concentration; smaller means more skew.
        min_samples: least examples per client.
        max_retries: draws before giving up with :class:`PartitionError`.
    """

    alpha: float
    min_samples: int = 10
    max_retries: int = 100

    def __post_init__(self) -> None:
        _positive_alpha(self.alpha)
        if self.min_samples < 0:
            raise ValueError(f"min_samples: expected >= 0, got {self.min_samples}")
        if self.max_retries < 1:
            raise ValueError(f"max_retries: expected >= 1, got {self.max_retries}")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        _check_clients(num_clients, len(labels))
        if self.min_samples * num_clients > len(labels):
            raise PartitionError(
                f"min_samples={self.min_samples} × {num_clients} clients exceeds the "
                f"{len(labels)} examples available"
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
            p = rng.dirichlet(np.full(num_clients, self.alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        return _finish(parts)


@PARTITIONERS.register(
    "dirichlet_client", "per client, Dir(α) over classes, equal sizes (Co-Boosting/FedCVAE)"
)
@dataclass(frozen=True)
class DirichletClient:
    """Per-client Dirichlet label skew (the form of Co-Boosting, Dai et al. 2024, and FedCVAE,
    Heinbaugh et al. 2023): client k draws q_k ~ Dir(α·1_C) over classes and receives
    ⌊N/K⌋ examples sampled without replacement from q_k.

    When a class runs out, its mass is renormalised over the classes that still have
    examples; each client needs at most C such rounds (every round empties a class), so the
    loop is bounded. Examples left over by the rounding are not assigned.

    Attributes:
        alpha: concentration; smaller means fewer classes per client.
        min_samples: least examples per client (checked against ⌊N/K⌋).
    """

    alpha: float
    min_samples: int = 10

    def __post_init__(self) -> None:
        _positive_alpha(self.alpha)
        if self.min_samples < 0:
            raise ValueError(f"min_samples: expected >= 0, got {self.min_samples}")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        _check_clients(num_clients, len(labels))
        size = len(labels) // num_clients
        if size < self.min_samples:
            raise PartitionError(
                f"dirichlet_client: {len(labels)} examples over {num_clients} clients gives "
                f"{size} each, expected >= min_samples={self.min_samples}"
            )
        pools = _by_class(labels, rng)
        remaining = np.array([len(p) for p in pools])
        taken = np.zeros(len(pools), dtype=int)
        parts: list[list[np.ndarray]] = []
        for _ in range(num_clients):
            counts = self._counts(
                rng.dirichlet(np.full(len(pools), self.alpha)), size, remaining, rng
            )
            parts.append([pools[c][taken[c] : taken[c] + n] for c, n in enumerate(counts) if n])
            taken += counts
            remaining -= counts
        return _finish(parts)

    @staticmethod
    def _counts(
        q: np.ndarray, size: int, remaining: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
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


@PARTITIONERS.register(
    "pathological", "#C classes per client, each class split equally among holders (FedOL)"
)
@dataclass(frozen=True)
class Pathological:
    """Pathological label skew #C as FedOL (Ye et al.) defines it: each client receives data
    from exactly ``classes_per_client`` classes, and a class's examples are split equally
    among the clients that hold it.

    Classes are dealt round-robin over a random class order (client k gets classes
    ``order[(k·#C + j) mod C]``, j < #C), so each client's classes are distinct and every class
    is held by ⌊K·#C/C⌋ or ⌈K·#C/C⌉ clients. When K·#C < C some classes go unused and their
    examples are not assigned. (McMahan et al.'s sort-and-shard split differs: shards of
    equal size, so a client's classes need not be distinct.)

    Attributes:
        classes_per_client: #C.
    """

    classes_per_client: int

    def __post_init__(self) -> None:
        if not isinstance(self.classes_per_client, int) or self.classes_per_client < 1:
            raise ValueError(
                f"classes_per_client: expected an integer >= 1, got {self.classes_per_client!r}"
            )

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        _check_clients(num_clients, len(labels))
        pools = _by_class(labels, rng)
        if self.classes_per_client > len(pools):
            raise ValueError(
                f"classes_per_client: expected at most the {len(pools)} classes, "
                f"got {self.classes_per_client}"
            )
        order = rng.permutation(len(pools))
        holders: list[list[int]] = [[] for _ in pools]
        for k in range(num_clients):
            for j in range(self.classes_per_client):
                holders[order[(k * self.classes_per_client + j) % len(pools)]].append(k)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, who in enumerate(holders):
            for k, chunk in zip(
                who, np.array_split(pools[c], len(who)) if who else [], strict=True
            ):
                parts[k].append(chunk)
        return _finish(parts)


@PARTITIONERS.register("disjoint", "each client its own disjoint label set (FedEOV's extreme)")
@dataclass(frozen=True)
class Disjoint:
    """Disjoint label sets, the extreme skew of FedOV / FedEOV (Diao et al. 2023): the classes
    are shuffled and cut into K groups as evenly as possible; client k gets every example of
    its group. Needs K ≤ C."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        _check_clients(num_clients, len(labels))
        pools = _by_class(labels, rng)
        if num_clients > len(pools):
            raise ValueError(
                f"disjoint: expected at most {len(pools)} clients (one class each), "
                f"got {num_clients}"
            )
        groups = np.array_split(rng.permutation(len(pools)), num_clients)
        return _finish([[pools[c] for c in g] for g in groups])


def make_partitioner(name: str, **options: Any) -> Any:
    """Build the partitioner ``name`` from those ``options`` its dataclass declares.

    ``None`` values mean "use the default".

    Raises:
        RegistryError: for an unknown name.
        ValueError: when a required option is missing or a value is invalid.
    """
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
        raise ValueError(f"partitioner {name!r} needs {missing}, got none")
    return cls(**kwargs)
