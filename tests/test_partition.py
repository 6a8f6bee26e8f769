"""Partitioners: invariants over the whole registry, skew vs α, bounded time, clear errors."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import numpy as np
import pytest

from oneshotfl.data.partition import (
    PARTITIONERS,
    Partitioner,
    PartitionError,
    class_counts,
    make_partitioner,
)
from oneshotfl.registry import RegistryError

LABELS = np.repeat(np.arange(10), 100)  # 1000 examples, 100 per class
OPTIONS: dict[str, Any] = {"alpha": 0.5, "classes_per_client": 2, "min_samples": 5, "psi": 0.7}
ASSIGNS_ALL = ("iid", "dirichlet", "pathological", "disjoint")


def split(
    name: str, seed: int = 0, clients: int = 5, labels: np.ndarray = LABELS, **options: Any
) -> list[np.ndarray]:
    partitioner = make_partitioner(name, **{**OPTIONS, **options})
    return partitioner.split(labels, clients, np.random.default_rng(seed))


def test_registry_holds_the_five_partitioners() -> None:
    assert PARTITIONERS.names() == [
        "dirichlet",
        "dirichlet_client",
        "disjoint",
        "iid",
        "pathological",
        "skew",
    ]
    for entry in PARTITIONERS.entries():
        assert dataclasses.is_dataclass(entry.obj) and issubclass(entry.obj, Partitioner)
        assert entry.obj.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert entry.description and re.search(r"\b20[12]\d\b", entry.obj.__doc__ or "")  # cites


@pytest.mark.parametrize("name", PARTITIONERS.names())
@pytest.mark.parametrize("labels", [LABELS, np.random.default_rng(7).integers(0, 10, 777)])
def test_every_index_valid_and_used_at_most_once(name: str, labels: np.ndarray) -> None:
    parts = split(name, labels=labels)
    assert len(parts) == 5
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted, unique
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat))
    assert flat.min() >= 0 and flat.max() < len(labels)
    if name in ASSIGNS_ALL:
        assert len(flat) == len(labels)


@pytest.mark.parametrize("name", PARTITIONERS.names())
def test_same_seed_same_split_other_seed_other_split(name: str) -> None:
    a, b, c = split(name, 0), split(name, 0), split(name, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("name", PARTITIONERS.names())
def test_only_the_given_generator_is_used(name: str) -> None:
    np.random.seed(0)
    a = split(name, 3)
    np.random.seed(99)
    np.random.random(17)
    assert all(np.array_equal(x, y) for x, y in zip(a, split(name, 3), strict=True))


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in split("iid", clients=7)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(LABELS)


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
    for clients, per in ((10, 3), (7, 2), (4, 10), (3, 1)):
        parts = split("pathological", clients=clients, classes_per_client=per)
        counts = class_counts(LABELS, parts, 10)
        assert ((counts > 0).sum(axis=1) == per).all()
        holders = (counts > 0).sum(axis=0)
        assert holders.max() - holders.min() <= 1 or clients * per < 10  # classes used evenly
        for c in range(10):
            held = counts[:, c][counts[:, c] > 0]
            if len(held):
                assert held.max() - held.min() <= 1 and held.sum() == 100


def test_pathological_uses_present_classes_only() -> None:
    labels = LABELS[LABELS != 3]  # class 3 absent: nobody may be dealt an empty class
    parts = split("pathological", clients=9, labels=labels, classes_per_client=2)
    counts = class_counts(labels, parts, 10)
    assert ((counts > 0).sum(axis=1) == 2).all() and counts[:, 3].sum() == 0
    assert sum(len(p) for p in parts) == len(labels)


def test_pathological_with_fewer_slots_than_classes_leaves_classes_unused() -> None:
    parts = split("pathological", clients=2, classes_per_client=3)
    counts = class_counts(LABELS, parts, 10)
    assert ((counts > 0).sum(axis=1) == 3).all() and (counts.sum(axis=0) > 0).sum() == 6


@pytest.mark.parametrize("psi", [0.0, 0.3, 0.7, 1.0])
def test_skew_takes_psi_of_each_client_from_its_dominant_classes(psi: float) -> None:
    parts = split("skew", clients=5, psi=psi)  # 1000 examples: 200 per client, 2 dominant
    counts = class_counts(LABELS, parts, 10)
    assert (counts.sum(1) == 200).all()
    top = np.sort(counts, axis=1)[:, -2:].sum(1)  # the two dominant classes
    assert np.allclose(top, 200 * (psi + (1 - psi) * 2 / 10), atol=2)
    if psi == 1.0:
        assert ((counts > 0).sum(1) == 2).all()  # the pathological split
    if psi == 0.0:
        assert (counts.max(1) - counts.min(1) <= 1).all()  # IID: 20 of every class


def test_skew_shrinks_quotas_of_a_scarce_class_alike() -> None:
    labels = np.concatenate([np.zeros(10, np.int64), np.repeat(np.arange(1, 10), 100)])
    parts = split("skew", clients=5, labels=labels, psi=0.5)
    counts = class_counts(labels, parts, 10)
    assert counts[:, 0].sum() <= 10 and all(len(p) <= len(labels) // 5 for p in parts)


def test_disjoint_label_sets() -> None:
    for clients in (4, 10):
        parts = split("disjoint", clients=clients)
        sets = [set(LABELS[p].tolist()) for p in parts]
        assert all(not (sets[i] & sets[j]) for i in range(clients) for j in range(i + 1, clients))
        assert set().union(*sets) == set(range(10))
        assert max(map(len, sets)) - min(map(len, sets)) <= 1


def test_dirichlet_client_sizes_are_equal() -> None:
    labels = np.random.default_rng(3).integers(0, 10, 1003)
    parts = split("dirichlet_client", clients=7, labels=labels, alpha=0.05)
    assert {len(p) for p in parts} == {1003 // 7}


@pytest.mark.parametrize("alpha", [0.3, 0.05])
def test_dirichlet_honours_min_samples(alpha: float) -> None:
    parts = split("dirichlet", clients=10, alpha=alpha, min_samples=40, max_retries=1000)
    assert min(len(p) for p in parts) >= 40


def test_tiny_alpha_finishes_or_fails_clearly() -> None:
    labels = np.repeat(np.arange(10), 5)
    start = time.perf_counter()
    with pytest.raises(PartitionError, match=r"smallest client still had .* larger alpha"):
        split("dirichlet", clients=10, labels=labels, alpha=0.001, min_samples=5)
    parts = split("dirichlet_client", clients=10, labels=labels, alpha=0.001, min_samples=1)
    assert sum(len(p) for p in parts) == 50
    big = np.repeat(np.arange(100), 50)
    parts = split("dirichlet_client", clients=100, labels=big, alpha=0.001, min_samples=1)
    assert sum(len(p) for p in parts) == 5000
    assert time.perf_counter() - start < 10


def test_infeasible_min_samples_fails_before_drawing() -> None:
    with pytest.raises(PartitionError, match="needs at least 2000 examples, got 1000"):
        split("dirichlet", clients=10, min_samples=200)
    with pytest.raises(PartitionError, match="gives 100 each, expected >= min_samples=200"):
        split("dirichlet_client", clients=10, min_samples=200)
    with pytest.raises(PartitionError, match="num_clients: expected at most the 1000 examples"):
        split("iid", clients=1001)


@pytest.mark.parametrize(
    ("name", "options", "clients", "fragment"),
    [
        ("dirichlet", {"alpha": 0}, 5, "alpha: expected a finite number > 0, got 0"),
        ("dirichlet", {"alpha": -1}, 5, "alpha: expected .* got -1"),
        ("dirichlet", {"alpha": float("inf")}, 5, "alpha: expected .* got inf"),
        ("dirichlet", {"alpha": True}, 5, "alpha: expected .* got True"),
        ("dirichlet", {"min_samples": -1}, 5, "min_samples: expected an integer >= 0, got -1"),
        ("dirichlet", {"max_retries": 0}, 5, "max_retries: expected an integer >= 1, got 0"),
        ("dirichlet_client", {"alpha": float("nan")}, 5, "alpha: expected .* got nan"),
        ("dirichlet_client", {"min_samples": 1.5}, 5, "min_samples: expected an integer"),
        (
            "pathological",
            {"classes_per_client": 11},
            5,
            "classes_per_client: expected at most the 10 classes in the labels, got 11",
        ),
        ("pathological", {"classes_per_client": 0}, 5, "classes_per_client: expected .* got 0"),
        ("pathological", {"classes_per_client": 2.0}, 5, "classes_per_client: expected an int"),
        ("disjoint", {}, 11, "disjoint: expected at most 10 clients .* got 11"),
        ("skew", {"psi": 1.5}, 5, "psi: expected in \\[0, 1\\], got 1.5"),
    ],
)
def test_bad_parameters_say_what_was_expected(
    name: str, options: dict[str, Any], clients: int, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        split(name, clients=clients, **options)


@pytest.mark.parametrize("name", PARTITIONERS.names())
@pytest.mark.parametrize("clients", [0, -2])
def test_num_clients_below_one_is_rejected(name: str, clients: int) -> None:
    with pytest.raises(ValueError, match=f"num_clients: expected an integer >= 1, got {clients}"):
        split(name, clients=clients)


@pytest.mark.parametrize("name", PARTITIONERS.names())
def test_bad_labels_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="labels: expected a 1-D integer array"):
        split(name, labels=LABELS.reshape(10, 100))
    with pytest.raises(ValueError, match="labels: expected non-negative class ids, got -1"):
        split(name, labels=LABELS - 1)


def test_numpy_integer_options_are_accepted() -> None:
    parts = split("pathological", classes_per_client=np.int64(2), min_samples=np.int32(1))
    assert sum(len(p) for p in parts) == len(LABELS)


def test_make_partitioner_passes_only_declared_options() -> None:
    p = make_partitioner("dirichlet", alpha=0.1, classes_per_client=3, min_samples=None)
    assert p == make_partitioner("dirichlet", alpha=0.1)
    retries = make_partitioner("dirichlet", alpha=0.1, max_retries=7)
    assert retries.max_retries == 7  # type: ignore[attr-defined]
    assert make_partitioner("iid", alpha=None, classes_per_client=None) == make_partitioner("iid")


def test_unknown_partitioner_and_missing_option() -> None:
    with pytest.raises(RegistryError, match="expected one of"):
        make_partitioner("zipf")
    with pytest.raises(ValueError, match="'dirichlet': expected a value for alpha, got none"):
        make_partitioner("dirichlet", alpha=None)
    with pytest.raises(ValueError, match="expected a value for classes_per_client"):
        make_partitioner("pathological")


def test_class_counts() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1]), np.array([], np.int64), np.array([3, 4, 5, 2])]
    counts = class_counts(labels, parts, 4)
    np.testing.assert_array_equal(counts, [[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 3, 0]])
    assert class_counts(labels, [], 3).shape == (0, 3)
    with pytest.raises(ValueError, match=r"labels: expected values in 0\.\.1, got 0\.\.2"):
        class_counts(labels, [np.arange(6)], 2)
