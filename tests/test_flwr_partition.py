"""The Flower Datasets bridge (issue 16, item 4): ``partition: flwr:ClassName[:key=value]``
runs a real ``flwr_datasets`` partitioner on our label vector, follows the partition seed, and
its Dirichlet split agrees in distribution with ours on the same labels."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from scipy import stats

from helpers import run_config
from oneshotfl.data.partition import PartitionError, class_counts, make_partitioner
from oneshotfl.runner.config import ConfigError

pytestmark = pytest.mark.skipif(  # without importing it: a worker that only collects this file
    importlib.util.find_spec("flwr_datasets") is None, reason="needs the flwr-datasets extra"
)

LABELS = np.repeat(np.arange(10), 400)  # 10 classes x 400 examples


def _shares(name: str, seeds: range, alpha: float = 0.5, clients: int = 10) -> np.ndarray:
    """Each (class, client) share of a class's examples, over ``seeds`` splits."""
    partitioner = make_partitioner(name, alpha=alpha, min_samples=10)
    out = []
    for seed in seeds:
        parts = partitioner.split(LABELS, clients, np.random.default_rng(seed))
        joined = np.concatenate(parts)
        assert len(np.unique(joined)) == len(joined) == len(LABELS)
        out.append(class_counts(LABELS, parts, 10).T / 400)
    return np.stack(out).ravel()


def test_our_dirichlet_and_flowers_agree_in_distribution() -> None:
    ours = _shares("dirichlet", range(40))
    theirs = _shares("flwr:DirichletPartitioner", range(40))
    # Dir(α·1_K) marginals: share ~ Beta(α, (K−1)α), mean 1/K, variance (1/K)(1−1/K)/(Kα+1)
    expected = 0.1 * 0.9 / (10 * 0.5 + 1)
    assert ours.mean() == pytest.approx(0.1) and theirs.mean() == pytest.approx(0.1)
    assert ours.var() == pytest.approx(expected, rel=0.15)
    assert theirs.var() == pytest.approx(expected, rel=0.15)
    assert stats.ks_2samp(ours, theirs).pvalue > 0.01


def test_the_bridge_follows_the_seed_and_takes_options_from_the_spec() -> None:
    bridge = make_partitioner("flwr:DirichletPartitioner:alpha=0.3:min_partition_size=5")
    same = [bridge.split(LABELS, 5, np.random.default_rng(7)) for _ in range(2)]
    other = bridge.split(LABELS, 5, np.random.default_rng(8))
    assert all(np.array_equal(a, b) for a, b in zip(*same, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(same[0], other, strict=True))
    iid = make_partitioner("flwr:IidPartitioner")
    first, again = (iid.split(LABELS, 4, np.random.default_rng(s)) for s in (0, 1))
    assert [len(p) for p in first] == [1000] * 4
    assert not np.array_equal(first[0], again[0])  # the seed moves even a seedless class
    assert len(np.unique(LABELS[first[0]])) == 10  # rows shuffled first, not cut in blocks


def test_only_disjoint_partitions_of_num_partitions_classes_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flwr_datasets.partitioner as module

    with pytest.raises(ValueError, match="takes num_partitions"):
        make_partitioner("flwr:NaturalIdPartitioner:partition_by=label")

    class Everything(module.IidPartitioner):  # every partition holds every row
        def load_partition(self, partition_id: int) -> Any:
            return self.dataset

    monkeypatch.setattr(module, "Everything", Everything, raising=False)
    with pytest.raises(PartitionError, match="disjoint"):
        make_partitioner("flwr:Everything").split(LABELS, 2, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("flwr:NoSuchPartitioner", "expected a flwr_datasets partitioner"),
        ("flwr:DirichletPartitioner:beta=1", "expected options among"),
        ("flwr:IidPartitioner:num_partitions=3", "num_partitions is the number of clients"),
        ("flwr:DirichletPartitioner:alpha", "expected key=value"),
    ],
)
def test_a_bad_flower_spec_is_a_one_line_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_partitioner(spec, alpha=0.5)


def test_a_run_partitioned_by_flower_datasets(tiny_config: Any) -> None:
    cfg = tiny_config(
        methods=["fedavg"], partition="flwr:DirichletPartitioner:min_partition_size=5"
    )
    doc = run_config(cfg)
    ours = run_config(tiny_config(methods=["fedavg"]))  # our dirichlet assigns every example
    assert sum(r["train_size"] for r in doc["clients"]) == sum(
        r["train_size"] for r in ours["clients"]
    )
    assert doc["clients"] != ours["clients"]
    with pytest.raises(ConfigError, match="partition 'flwr:NoSuch'"):
        run_config(tiny_config(methods=["fedavg"], partition="flwr:NoSuch"))
    huge = "flwr:DirichletPartitioner:min_partition_size=100000"
    with pytest.raises(PartitionError):
        run_config(tiny_config(methods=["fedavg"], partition=huge))
