"""Partitioners: invariants over the whole registry, skew vs α, bounded time, clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oneshotfl.data.partition import (
    PARTITIONERS,
    PartitionError,
    class_counts,
    make_partitioner,
)
from oneshotfl.registry import RegistryError

LABELS = np.repeat(np.arange(10), 100)  # 1000 examples, 100 per class
OPTIONS: dict[str, Any] = {"alpha": 0.5, "classes_per_client": 2, "min_samples": 5}
ASSIGNS_ALL = ("iid", "dirichlet", "pathological", "disjoint")


def split(
    name: str, seed: int = 0, clients: int = 5, labels: np.ndarray = LABELS, **options: Any
) -> list[np.ndarray]:
    partitioner = make_partitioner(name, **{**OPTIONS, **options})
    return partitioner.split(labels, clients, np.random.default_rng(seed))


@pytest.mark.parametrize("name", PARTITIONERS.names())
def test_every_index_valid_and_used_at_most_once(name: str) -> None:
    parts = split(name)
    assert len(parts) == 5
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64 and len(flat) == len(set(flat.tolist()))
    assert flat.min() >= 0 and flat.max() < len(LABELS)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted
    if name in ASSIGNS_ALL:
        assert len(flat) == len(LABELS)


@pytest.mark.parametrize("name", PARTITIONERS.names())
def test_same_seed_same_split_other_seed_other_split(name: str) -> None:
    a, b, c = split(name, 0), split(name, 0), split(name, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def mean_label_entropy(parts: list[np.ndarray]) -> float:
    counts = class_counts(LABELS, parts, 10).astype(float)
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    return float(h.mean())


@pytest.mark.parametrize("name", ["dirichlet", "dirichlet_client"])
def test_skew_grows_as_alpha_shrinks(name: str) -> None:
    entropy = {
        a: np.mean([mean_label_entropy(split(name, s, alpha=a, min_samples=1)) for s in range(3)])
        for a in (0.05, 1.0, 100.0)
    }
    assert entropy[0.05] < entropy[1.0] < entropy[100.0]
    assert entropy[100.0] > 0.95 * np.log(10)  # near uniform


def test_pathological_gives_exactly_c_classes_split_equally() -> None:
    parts = split("pathological", clients=10, classes_per_client=3)
    counts = class_counts(LABELS, parts, 10)
    assert ((counts > 0).sum(axis=1) == 3).all()
    for c in range(10):
        held = counts[:, c][counts[:, c] > 0]
        assert held.max() - held.min() <= 1 and held.sum() == 100


def test_disjoint_label_sets() -> None:
    parts = split("disjoint", clients=4)
    sets = [set(LABELS[p].tolist()) for p in parts]
    assert all(not (sets[i] & sets[j]) for i in range(4) for j in range(i + 1, 4))
    assert set().union(*sets) == set(range(10))


def test_dirichlet_honours_min_samples() -> None:
    parts = split("dirichlet", clients=10, alpha=0.3, min_samples=40)
    assert min(len(p) for p in parts) >= 40


def test_tiny_alpha_finishes_or_fails_clearly() -> None:
    labels = np.repeat(np.arange(10), 5)
    with pytest.raises(PartitionError, match="smallest client"):
        split("dirichlet", clients=10, labels=labels, alpha=0.001, min_samples=5, max_retries=20)
    parts = split("dirichlet_client", clients=10, labels=labels, alpha=0.001, min_samples=1)
    assert sum(len(p) for p in parts) == 50


@pytest.mark.parametrize(
    ("name", "options", "clients", "fragment"),
    [
        ("dirichlet", {"alpha": 0}, 5, "alpha: expected a finite number > 0, got 0"),
        ("dirichlet", {"alpha": -1}, 5, "alpha"),
        ("dirichlet_client", {"alpha": float("nan")}, 5, "alpha"),
        ("pathological", {"classes_per_client": 11}, 5, "at most the 10 classes, got 11"),
        ("pathological", {"classes_per_client": 0}, 5, "classes_per_client"),
        ("disjoint", {}, 11, "at most 10 clients"),
        ("iid", {}, 0, "num_clients: expected >= 1, got 0"),
    ],
)
def test_bad_parameters_say_what_was_expected(
    name: str, options: dict[str, Any], clients: int, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        split(name, clients=clients, **options)


def test_unknown_partitioner_and_missing_option() -> None:
    with pytest.raises(RegistryError, match="expected one of"):
        make_partitioner("zipf")
    with pytest.raises(ValueError, match="needs \\['alpha'\\]"):
        make_partitioner("dirichlet", alpha=None)
