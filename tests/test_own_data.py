"""The server's bookkeeping comes from what clients report, never from its own copy of the
data, and a Flower node can bring its own dataset (issue 15, item 4): shard reports are
bounded and a lying one is refused and named; a node's own npz or image folder becomes its
shard (labels by index or by class name, the task's image shape, at most N_max examples)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import prepare, run_config
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.ledger import ShardReport, shard_problem

flwr = pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402

from fakegrid import FakeGrid, run_on_grid, task_identity  # noqa: E402, F401
from oneshotfl.flower.messages import (  # noqa: E402
    REPLY,
    MessageError,
    read_reply,
    read_shard,
    reply_content,
)
from oneshotfl.flower.node import NodeCache, NodeIdentity, node_identity, node_state  # noqa: E402
from oneshotfl.runner.transport import ClientReply  # noqa: E402


def digits_npz(path: Path, labels: tuple[int, ...], per_class: int = 12) -> str:
    """An npz of real digits images (pixels in [0, 1]) of the given classes, as a node's own
    data; the spec declares the digits normalisation, as the federation's dataset has."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    keep = np.concatenate([np.flatnonzero(bunch.target == c)[:per_class] for c in labels])
    np.savez(path, x=(bunch.images[keep] / 16).astype(np.float32), y=bunch.target[keep])
    return f"npz:path={path}:classes=10:mean=0.3:std=0.38"


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (None, "sent no shard report"),
        (ShardReport(3, 0, (1, 2)), "expected 3 label counts, got 2"),
        (ShardReport(3, 0, (1, 2, -0)), "sum to 3"),  # fine: the control row
        (ShardReport(3, 0, (4, -1, 0)), "integer sizes and label counts >= 0"),
        (ShardReport(3, 0, (True, 2, 0)), "integer sizes and label counts >= 0"),
        (ShardReport(3, -1, (1, 2, 0)), "integer sizes and label counts >= 0"),
        (ShardReport(5, 0, (1, 2, 0)), "label counts sum to 3, train_size is 5"),
        (ShardReport(60, 50, (20, 20, 20)), "110 examples, above N_max = 100"),
    ],
)
def test_a_shard_report_is_bounded_by_the_classes_and_n_max(
    report: ShardReport | None, expected: str
) -> None:
    problem = shard_problem(report, 3, 100)
    if expected == "sum to 3":
        assert problem is None
    else:
        assert problem is not None and expected in problem
    assert shard_problem(ShardReport(60, 50, (20, 20, 20)), 3, 0) is None  # N_max not known


def test_a_shard_report_crosses_flower_and_malformed_ones_are_refused() -> None:
    report = ShardReport(4, 1, (1, 3, 0))
    reply = read_reply(reply_content(ClientReply(0, b"abc", 0.1, {}, report)))
    assert reply.shard == report
    assert read_shard("") is None
    bad = [
        "[1, 2]",
        '{"train_size": 1, "val_size": 0}',
        '{"train_size": 1.5, "val_size": 0, "label_histogram": [1]}',
        '{"train_size": 1, "val_size": 0, "label_histogram": "1"}',
        '{"train_size": 1, "val_size": 0, "label_histogram": [true]}',
        '{"train_size": 1, "val_size": 0, "label_histogram": [1], "x": 2}',
        "{not json",
        " " * 2_000_001,
        '{"train_size": 1' + "0" * 5000 + ', "val_size": 0, "label_histogram": [1]}',
        "[" * 100_000 + "]" * 100_000,
    ]
    for text in bad:
        with pytest.raises(MessageError, match=r"oneshotfl.reply.shard"):
            read_shard(text)
    with pytest.raises(MessageError, match="JSON string"):
        read_shard(7)


def test_in_simulation_the_reports_are_the_clients_shards(
    tiny_config: Any,
) -> None:
    cfg = tiny_config(methods=["fedavg", "local"])
    doc = run_config(cfg)
    exp = prepare(cfg)
    for row, shard in zip(doc["clients"], exp.data.clients, strict=True):
        assert row["train_size"] == len(shard.train)
        assert row["label_histogram"] == np.bincount(shard.train.y, minlength=10).tolist()
        assert "reported" not in row


def _lie(node_id: int, report: ShardReport) -> Any:
    """A tamper: node ``node_id`` replaces its shard report with ``report``."""

    def tamper(node: int, instruction: Message, reply: Message) -> Message:
        if node != node_id or REPLY not in reply.content.config_records:
            return reply
        parsed = read_reply(reply.content)
        changed = dataclasses.replace(parsed, shard=report)
        return Message(reply_content(changed), reply_to=instruction)

    return tamper


def test_the_server_uses_what_nodes_report_and_refuses_a_lying_report(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"], min_clients=2)
    exp = prepare(cfg)
    # node 101 reports only class 3: a different story than the server's copy, and valid
    story = ShardReport(40, 0, tuple(40 if c == 3 else 0 for c in range(10)))
    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=_lie(101, story)))
    row = doc["clients"][1]
    assert row["train_size"] == 40 and row["label_histogram"] == list(story.label_histogram)
    assert row["train_size"] != len(exp.data.shard(1).train)
    method = doc["methods"][0]
    assert method["client_personal_accuracy"][1] == pytest.approx(method["per_class_accuracy"][3])
    # above N_max: refused and named, the run goes on with the others
    huge = ShardReport(exp.train_pool + 1, 0, (exp.train_pool + 1,) + (0,) * 9)
    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=_lie(102, huge)), "lie")
    method = doc["methods"][0]
    assert method["clients_used"] == [0, 1]
    assert method["rejected"]["2"].startswith("client 2: shard report:")
    assert "above N_max" in method["rejected"]["2"]
    assert doc["clients"][2]["reported"] is False
    assert method["client_personal_accuracy"][2] is None


def test_a_client_refused_in_round_0_stays_out_of_every_later_round(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg_rounds:rounds=2"], min_clients=2)
    short = ShardReport(3, 0, (1, 2))  # two label counts where the task has ten
    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=_lie(102, short)))
    method = doc["methods"][0]
    assert method["clients_used"] == [0, 1]
    assert "expected 10 label counts" in method["rejected"]["2"]  # the first reason stays
    assert len(method["rounds_history"]) == 2
    assert method["upload_bytes_per_client"][2] > 0  # its bytes crossed the wire: counted


def test_a_node_brings_its_own_npz_and_the_server_books_what_it_reports(
    tiny_config: Any, tmp_path: Path
) -> None:
    spec = digits_npz(tmp_path / "own.npz", (1, 4), per_class=15)
    cfg = tiny_config(methods=["fedavg", "local"], val_fraction=0.2, max_client_examples=900)
    grid = FakeGrid(cfg.clients)
    grid.node_config[102]["dataset"] = spec
    doc = run_on_grid(tmp_path, cfg, grid)
    row = doc["clients"][2]
    assert (row["train_size"], row["val_size"]) == (24, 6)
    assert sum(row["label_histogram"]) == 24
    assert {c for c, n in enumerate(row["label_histogram"]) if n} <= {1, 4}
    assert doc["methods"][0]["clients_used"] == [0, 1, 2]
    assert doc["config"]["max_client_examples"] == 900


def test_a_node_brings_its_own_image_folder_with_labels_by_class_name(
    tiny_config: Any, tmp_path: Path
) -> None:
    root = tmp_path / "mine"
    for name, count in (("7", 3), ("2", 5)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("L", (8, 8), 40 * i).save(root / name / f"{i}.png")
    cfg = tiny_config(methods=["fedavg"])
    spec = f"folder:path={root}:size=8:channels=1:mean=0.3:std=0.38"
    state = node_state(cfg.to_dict(), NodeIdentity(1, dataset=spec), NodeCache())
    shard = state.federation.data.shard(1)
    assert len(shard.train) == 8 and shard.val is None
    assert torch.bincount(shard.train.y, minlength=10).tolist() == [0, 0, 5] + [0] * 4 + [3, 0, 0]
    report = state.federation.shard_report(1)
    assert report == ShardReport(8, 0, (0, 0, 5, 0, 0, 0, 0, 3, 0, 0))


def test_a_node_dataset_that_does_not_fit_the_task_is_a_one_line_config_error(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"])
    big = np.zeros((4, 16, 16), np.float32)
    np.savez(tmp_path / "big.npz", x=big, y=np.arange(4))
    np.savez(tmp_path / "labels.npz", x=np.zeros((12, 8, 8), np.float32), y=np.arange(12))
    root = tmp_path / "names"
    (root / "cat").mkdir(parents=True)
    Image.new("L", (8, 8)).save(root / "cat" / "a.png")
    Image.new("L", (8, 8)).save(root / "cat" / "b.png")
    cases = {
        f"npz:path={tmp_path / 'big.npz'}": "side 8 (the task's), got 1 and 16",
        f"npz:path={tmp_path / 'labels.npz'}": "expected labels 0..9",
        f"folder:path={root}:size=8:channels=1": "classes among the task's",
        f"npz:path={tmp_path / 'absent.npz'}": "got nothing",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            node_state(cfg.to_dict(), NodeIdentity(0, dataset=spec), NodeCache())
    many = digits_npz(tmp_path / "many.npz", (0, 1, 2, 3, 4), per_class=160)
    small = tiny_config(methods=["fedavg"], max_client_examples=700)
    with pytest.raises(ConfigError, match=r"at most N_max = 700 examples .*got 800"):
        node_state(small.to_dict(), NodeIdentity(0, dataset=many), NodeCache())
    skewed = tiny_config(methods=["fedavg"], feature_skew="rotation")
    with pytest.raises(ConfigError, match="feature_skew"):
        node_state(skewed.to_dict(), NodeIdentity(0, dataset=many), NodeCache())
    for bad in ("digits", 3, "npz:size=3"):
        with pytest.raises(ConfigError, match="node config"):
            node_identity({"partition-id": 0, "dataset": bad})


def test_max_client_examples_is_n_max_and_must_hold_every_client(tiny_config: Any) -> None:
    exp = prepare(tiny_config(max_client_examples=5000))
    assert exp.train_pool == 5000 and exp.dims.max_examples == 5000
    with pytest.raises(ConfigError, match="largest client's"):
        prepare(tiny_config(max_client_examples=10))
    with pytest.raises(ConfigError, match="max_client_examples"):
        tiny_config(max_client_examples=-1)
    assert json.dumps(run_config(tiny_config(methods=["fedavg"]))["clients"])
