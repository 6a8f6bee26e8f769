"""The Flower adapter in process: a test double for the Grid drives the real ServerApp body
and the real ClientApp handler, so the message flow, dropouts, quorum, rejection and the
equality with the local simulation are tested without starting Flower's runtime."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict  # noqa: E402

import oneshotfl.flower.grid as grid_module  # noqa: E402
import toys  # noqa: E402
from fakegrid import FakeGrid, Tamper, core, run_on_grid, task_identity  # noqa: E402, F401
from helpers import prepare, registered, run_config  # noqa: E402
from oneshotfl.flower.batch import FAILED, read_batch_reply  # noqa: E402
from oneshotfl.flower.messages import (  # noqa: E402
    INSTRUCTION,
    PAYLOADS,
    REPLY,
    MessageError,
    bytes_record,
    read_reply,
    record_bytes,
    reply_content,
    sender,
)
from oneshotfl.flower.node import (  # noqa: E402
    NodeCache,
    NodeIdentity,
    node_identity,
    node_state,
)
from oneshotfl.flower.server import ServerSettings, run_server, send_and_receive  # noqa: E402
from oneshotfl.payload import Payload, decode, encode  # noqa: E402
from oneshotfl.runner.config import ConfigError  # noqa: E402
from oneshotfl.runner.transport import ClientReply  # noqa: E402


def test_flower_gives_the_local_simulation_result(tiny_config: Any, tmp_path: Path) -> None:
    cfg = tiny_config(methods=["local", "fedavg", "ensemble", "fedavg_rounds:rounds=2"])
    local = run_config(cfg)
    grid = FakeGrid(cfg.clients)
    # a cache of its own: the nodes train their models again rather than reuse the local ones
    flower = run_on_grid(
        tmp_path, dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes")), grid
    )
    assert core(flower) == core(local)
    assert flower["clients"] == local["clients"]
    assert flower["flower"]["node_clients"] == {"100": 0, "101": 1, "102": 2}
    assert flower["flower"]["no_reply"] == {}
    for name in ("result.json", "methods.csv", "clients.csv"):
        assert (tmp_path / "out" / name).is_file()
    # per node: one message for the round 0 of local, fedavg and ensemble (batch-updates),
    # then fedavg_rounds' 2 rounds (its round 0 carries the server's initial model)
    assert len(grid.sent) == 3 * (1 + 2)
    batch = [m for m in grid.sent if m.content.config_records[INSTRUCTION]["batch"] != "[]"]
    assert len(batch) == 3 and all(_keys(m) == ["local", "fedavg", "ensemble"] for m in batch)


def _keys(message: Message) -> list[str]:
    """The method keys an instruction asks for, its own first."""
    record = message.content.config_records[INSTRUCTION]
    return [str(record["key"]), *(k for k, _ in json.loads(str(record["batch"])))]


def test_one_message_per_method_without_batch_updates_gives_the_same_result(
    tiny_config: Any, tmp_path: Path
) -> None:
    """``batch-updates = false``: one message per node per method and round, the same result
    as the batched run (the methods' client steps are the same, in the same order)."""
    cfg = tiny_config(methods=["local", "fedavg", "ensemble"])
    runs = {}
    for batch in (True, False):
        grid = FakeGrid(cfg.clients)
        runs[batch] = run_on_grid(tmp_path, cfg, grid, f"batch-{batch}", batch=batch)
        assert len(grid.sent) == 3 * (1 if batch else 3)
        assert runs[batch]["flower"]["batch_updates"] is batch
    assert core(runs[True]) == core(runs[False])
    assert runs[True]["clients"] == runs[False]["clients"]


def test_a_method_failing_on_a_node_in_a_batch_costs_the_others_nothing(
    tiny_config: Any, tmp_path: Path
) -> None:
    """In a batched instruction, the node answers for every method it could run: the one
    that failed there is named for that method only; a node whose whole answer is an error,
    or is malformed, is named for every method of the batch."""
    cfg = tiny_config(methods=["fedavg", "ensemble"], clients=4, min_clients=1)

    def tamper(node: int, instruction: Message, reply: Message) -> Message | None:
        if node == 101:  # ensemble's entry failed on this node
            del reply.content[f"{REPLY}.1"], reply.content[f"{PAYLOADS}.1"]
            reply.content[f"{FAILED}.1"] = ConfigRecord({"reason": "ValueError: no memory"})
        elif node == 102:
            return Message(Error(code=1, reason="node broken"), reply_to=instruction)
        elif node == 103:  # an entry more than asked for
            reply.content[f"{FAILED}.2"] = ConfigRecord({"reason": "?"})
        return reply

    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=tamper))
    fedavg, ensemble = doc["methods"]
    assert fedavg["clients_used"] == [0, 1] and ensemble["clients_used"] == [0]
    assert "ValueError: no memory" in ensemble["no_reply"]["node 101 (client 1)"]
    for method in (fedavg, ensemble):
        assert "node broken" in method["no_reply"]["node 102"]
        assert "malformed reply" in method["no_reply"]["node 103"]


def test_a_silent_node_is_named_and_the_quorum_still_aggregates(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"], min_clients=2)
    grid = FakeGrid(cfg.clients, tamper=lambda node, _, reply: None if node == 101 else reply)
    doc = run_on_grid(tmp_path, cfg, grid)
    method = doc["methods"][0]
    assert method["clients_used"] == [0, 2]
    assert method["upload_bytes_per_client"][1] == 0
    assert sorted(method["no_reply"]) == ["client 1", "node 101"]
    assert "no reply within" in method["no_reply"]["node 101"]


def test_below_the_quorum_the_method_fails_naming_the_missing_nodes(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"], min_clients=3)

    def fail(node: int, instruction: Message, reply: Message) -> Message | None:
        if node != 102:
            return reply
        error = Message(Error(code=1, reason="out of memory"), reply_to=instruction)
        error.metadata.__dict__["_src_node_id"] = 1  # errors the SuperLink writes come from it
        return error

    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=fail))
    why = doc["failed_methods"]["fedavg"]  # recorded; the run's other results are written
    assert re.search(r"QuorumError: .*expected at least 3.*node 102.*out of memory", why), why
    assert (tmp_path / "out" / "result.json").exists() and doc["methods"] == []


def test_an_invalid_payload_is_rejected_like_in_simulation(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"], min_clients=2)

    def nan_weights(node: int, instruction: Message, reply: Message) -> Message | None:
        if node != 101:
            return reply
        parsed = read_reply(reply.content)
        payload = decode(parsed.data)
        arrays = {
            k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
            for k, v in payload.arrays.items()
        }
        bad = ClientReply(
            1, encode(Payload(arrays, payload.scalars)), parsed.wall_s, shard=parsed.shard
        )
        return Message(reply_content(bad), reply_to=instruction)

    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=nan_weights))
    method = doc["methods"][0]
    assert method["clients_used"] == [0, 2]
    assert "client 1" in method["rejected"]["1"] and "finite" in method["rejected"]["1"]
    assert method["upload_bytes_per_client"][1] == method["upload_bytes_per_client"][0]


def test_payload_bytes_cross_flower_records_unchanged() -> None:
    blob = encode(Payload({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"n": 3}))
    assert record_bytes(bytes_record({"client-0": blob})) == {"client-0": blob}
    wrong = ArrayRecord({"client-0": Array(np.zeros(3, dtype=np.float32))})
    with pytest.raises(MessageError, match=r"expected stype 'oneshotfl\.safetensors'"):
        record_bytes(wrong)


def test_a_reply_must_carry_its_own_client_payload() -> None:
    reply = ClientReply(2, b"abc", 0.1)
    content = reply_content(reply)
    content[PAYLOADS] = bytes_record({sender(1): b"abc"})
    with pytest.raises(MessageError, match="expected exactly the payload 'client-2'"):
        read_reply(content)
    assert read_reply(reply_content(reply)) == reply


@pytest.mark.parametrize(
    ("node_config", "fragment"),
    [
        ({}, "expected partition-id"),
        ({"partition-id": "0"}, "expected partition-id"),
        ({"partition-id": 0, "num-partitions": "3"}, "num-partitions must be an integer"),
    ],
)
def test_bad_node_config_is_refused_clearly(node_config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        node_identity(node_config)


def test_bad_run_config_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match=r"reply-timeout: expected seconds > 0, got -1"):
        ServerSettings.from_run_config({"reply-timeout": -1})
    settings = ServerSettings.from_run_config({"overrides": "clients=3 'model=mlp'"})
    assert settings.overrides == ("clients=3", "model=mlp")
    assert settings.batch_updates is True
    with pytest.raises(ConfigError, match=r"batch-updates: expected true or false, got 'yes'"):
        ServerSettings.from_run_config({"batch-updates": "yes"})


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("facts", "{not json", "facts: expected JSON"),
        ("facts", '{"local_test_accuracy": "high"}', "a JSON object of numbers"),
        ("client_id", "0", "client_id: expected int, got str"),
    ],
)
def test_a_malformed_reply_is_refused_with_a_clear_error(
    field: str, value: str, fragment: str
) -> None:
    content = reply_content(ClientReply(0, b"abc", 0.1, 1.0))
    content.config_records[REPLY][field] = value
    with pytest.raises(MessageError, match=fragment):
        read_reply(content)


def test_a_node_holds_only_its_own_shard(tiny_config: Any) -> None:
    cfg = tiny_config()
    local = prepare(cfg)
    state = node_state(cfg.to_dict(), NodeIdentity(partition_id=1, num_partitions=3), NodeCache())
    (shard,) = state.federation.data.clients
    assert shard.client_id == 1
    assert np.array_equal(shard.indices, local.data.clients[1].indices)
    with pytest.raises(ConfigError, match="num-partitions=4, but the experiment has clients=3"):
        node_state(cfg.to_dict(), NodeIdentity(partition_id=1, num_partitions=4), NodeCache())


def test_a_peer_method_is_relayed_and_equals_the_local_simulation(
    tiny_config: Any, tmp_path: Path
) -> None:
    with registered("toy_average", toys.NeighbourAverage):
        cfg = tiny_config(methods=["peer_ensemble", "toy_average"], graph="ring:k=1", clients=4)
        local = run_config(cfg)
        grid = FakeGrid(cfg.clients)
        flower = run_on_grid(
            tmp_path, dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes")), grid
        )
    assert core(flower) == core(local)
    for a, b in zip(local["methods"], flower["methods"], strict=True):
        for name in ("client_accuracy", "client_personal_accuracy", "topology", "rejected"):
            assert a[name] == b[name], name
    assert flower["graph"] == local["graph"]
    # one update message per node for both methods, then per method one receive message per
    # node; the relay forwards each sender's bytes unchanged, only to its graph neighbours
    assert len(grid.sent) == 4 + 2 * 4
    updates = {m.metadata.dst_node_id: m for m in grid.sent[:4]}
    assert set(updates) == {100, 101, 102, 103}
    sent_bytes: dict[int, bytes] = {}
    for reply in grid.replies[:4]:
        parsed = read_batch_reply(reply.content, 2)[0]  # peer_ensemble's entry
        assert isinstance(parsed, ClientReply)
        sent_bytes[parsed.client_id] = parsed.data
    for message in grid.sent[4:8]:
        receiver = message.metadata.dst_node_id - 100
        relayed = record_bytes(message.content.array_records[PAYLOADS])
        neighbours = {(receiver - 1) % 4, (receiver + 1) % 4}
        assert relayed == {sender(s): sent_bytes[s] for s in sorted(neighbours)}


def _step(message: Message) -> str:
    return str(message.content.config_records["oneshotfl.instruction"]["step"])


def _fail_at(node_id: int, step: str) -> Tamper:
    def tamper(node: int, instruction: Message, reply: Message) -> Message | None:
        if node != node_id or _step(instruction) != step:
            return reply
        return Message(Error(code=1, reason=f"broken in {step}"), reply_to=instruction)

    return tamper


def test_a_peer_node_failing_its_update_is_named_and_never_relayed_to(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["peer_ensemble"], graph="complete", clients=4)
    grid = FakeGrid(cfg.clients, tamper=_fail_at(102, "update"))
    result = run_on_grid(tmp_path, cfg, grid)["methods"][0]
    assert result["clients_used"] == [0, 1, 3]
    assert "broken in update" in result["no_reply"]["node 102"]
    assert all(2 not in (s, r) for s, r, _ in result["topology"]["edges"])
    receives = [m for m in grid.sent if _step(m) == "receive"]
    assert sorted(m.metadata.dst_node_id for m in receives) == [100, 101, 103]


def test_a_peer_node_failing_its_receipt_is_named_and_the_others_report(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["peer_ensemble"], graph="complete", clients=4)
    result = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=_fail_at(101, "receive")))
    method = result["methods"][0]
    assert method["clients_used"] == [0, 2, 3] and len(method["client_accuracy"]) == 3
    assert "broken in receive" in method["no_reply"]["node 101 (client 1)"]
    assert method["upload_bytes_per_client"][1] > 0  # its own update went out


def test_a_malformed_or_misattributed_report_is_refused(tiny_config: Any, tmp_path: Path) -> None:
    cfg = tiny_config(methods=["peer_ensemble"], graph="complete", clients=3)

    def tamper(node: int, instruction: Message, reply: Message) -> Message | None:
        if _step(instruction) != "receive" or node == 100:
            return reply
        content = RecordDict()
        if node == 101:  # a report without its record
            content["oneshotfl.other"] = ArrayRecord()
        else:  # a report for another client
            content = reply.content
            content.config_records["oneshotfl.report"]["receiver"] = 0
        return Message(content, reply_to=instruction)

    method = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=tamper))["methods"][0]
    assert method["clients_used"] == [0]
    assert "malformed report" in method["no_reply"]["node 101 (client 1)"]
    assert "reported for client 0" in method["no_reply"]["node 102 (client 2)"]


@pytest.mark.xdist_group("open-set")  # with test_fedeov's: one worker makes the run once
def test_the_open_set_methods_on_flower_equal_the_local_simulation(
    open_set_run: tuple[Any, Any], tmp_path: Path
) -> None:
    cfg, local = open_set_run  # test_fedeov's fedov, fedeov and both variants, tiny, run locally
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)
    assert flower["clients"] == local["clients"]


def test_the_nodes_build_methods_with_the_runs_method_defaults(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedprox"], method_defaults=["fedprox:mu=5.0"])
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)
    assert flower["methods"][0]["params"]["mu"] == 5.0
    plain = run_config(tiny_config(methods=["fedprox"], cache_dir=str(tmp_path / "plain")))
    assert core(plain) != core(local)  # the nodes did not fall back to mu's default


def test_a_feature_skewed_federation_on_flower_equals_the_local_simulation(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg", "ensemble"], feature_skew="color")
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)


def test_the_data_free_methods_on_flower_equal_the_local_simulation(
    tiny_config: Any, tmp_path: Path
) -> None:
    from test_dense import VARIANTS as DISTIL  # DENSE, Co-Boosting fixed and boosted, tiny
    from test_intactofl import VARIANTS  # both readings and the noisy top-K gates, tiny
    from test_inversion import VARIANTS as INVERT  # F-ADI and F-DAFL, both readings, tiny
    from test_ma_echo import VARIANTS as ECHO  # MA-Echo, both bias readings, tiny

    cfg = tiny_config(methods=[*VARIANTS, *DISTIL, *INVERT, *ECHO], public_size=100)
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)


def test_fol_on_flower_equals_the_local_simulation(tiny_config: Any, tmp_path: Path) -> None:
    from test_fol import FOL

    cfg = tiny_config(methods=[FOL], graph="ring", clients=4, val_fraction=0.2)
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)
    a, b = local["methods"][0], flower["methods"][0]
    for name in ("client_accuracy", "client_personal_accuracy", "topology"):
        assert a[name] == b[name], name


def test_a_node_bound_to_one_client_cannot_answer_for_another(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["fedavg"], clients=3, min_clients=1)
    grid = FakeGrid(3)
    grid.node_config[101]["partition-id"] = 2  # a registered node claims client 2's shard
    config = tmp_path / "out.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    run_config = {
        "config": str(config),
        "out": str(tmp_path / "out"),
        "node-timeout": 1.0,
        "reply-timeout": 1.0,
        "node-clients": "100=0 101=1",  # node 102 is not part of this deployment
    }
    doc = run_server(grid, run_config, "test")
    method = doc["methods"][0]
    assert method["clients_used"] == [0]
    assert "binds it to client 1: refused" in method["no_reply"]["node 101 (client 1)"]
    assert 102 not in {m.metadata.dst_node_id for m in grid.sent}  # a stranger: never addressed
    assert doc["flower"]["binding"] == {"100": 0, "101": 1}
    with pytest.raises(ConfigError, match="NODE=CLIENT"):
        run_server(grid, {**run_config, "node-clients": "100=x"}, "test")
    with pytest.raises(ConfigError, match="twice"):
        run_server(grid, {**run_config, "node-clients": "100=0 101=0"}, "test")


def test_a_flower_node_loads_the_plugins_of_the_run(
    tiny_config: Any, tmp_path: Path, forget: list[str]
) -> None:
    from test_plugins import PLUGIN

    forget.append("mine_node")
    file = tmp_path / "mine_node.py"
    file.write_text(PLUGIN.format(name="mine_node"))
    cfg = tiny_config(methods=["mine_node"], plugins=[str(file)])
    local = run_config(cfg)
    grid = FakeGrid(cfg.clients)
    flower = run_on_grid(
        tmp_path, dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes")), grid
    )
    assert core(flower) == core(local)
    assert flower["config"]["plugins"] == [str(file)]


class SlowGrid:
    """Replies become available on the ``ready``-th pull (a node that takes a while)."""

    def __init__(self, ready: int) -> None:
        self.ready, self.pulls, self.pending = ready, 0, {}

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{i}"
            self.pending[f"m{i}"] = Message(RecordDict(), reply_to=message)
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, ids: Any) -> list[Message]:
        self.pulls += 1
        if self.pulls < self.ready:
            return []
        return [self.pending.pop(i) for i in list(ids) if i in self.pending]


def test_a_round_ends_at_the_first_pull_after_its_last_reply() -> None:
    def messages() -> list[Message]:
        return [Message(RecordDict(), dst_node_id=100 + i, message_type="train") for i in range(3)]

    grid = SlowGrid(ready=4)
    replies = send_and_receive(grid, messages(), timeout=30.0, poll=0.01)
    assert len(replies) == 3 and grid.pulls == 4  # polled until the replies came, no more
    late = SlowGrid(ready=10**6)
    assert send_and_receive(late, messages(), timeout=0.05, poll=0.01) == []
    assert 2 <= late.pulls < 50  # gave up at the timeout


class FakeClock:
    """Stands in for the ``time`` module of :mod:`oneshotfl.flower.grid`: sleeping advances
    it, nothing waits."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_waiting_round_pulls_less_often_until_a_reply_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(grid_module, "time", clock)
    grid = SlowGrid(ready=8)
    msgs = [Message(RecordDict(), dst_node_id=100 + i, message_type="train") for i in range(2)]
    replies = send_and_receive(grid, msgs, timeout=60.0, poll=0.1, max_poll=0.8)
    assert len(replies) == 2 and grid.pulls == 8
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.8, 0.8, 0.8])  # backed off, capped
    silent = SlowGrid(ready=10**6)
    assert send_and_receive(silent, msgs, timeout=10.0, poll=0.1, max_poll=0.8) == []
    assert silent.pulls <= 16  # 10 s at 0.8 s a pull, not 100 pulls at 0.1 s


def test_a_binding_waits_for_its_bound_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(grid_module, "time", clock)

    class Arriving:  # nodes 1, 2, 3 at once; bound node 7 connects on the fifth look
        looks = 0

        def get_node_ids(self) -> list[int]:
            self.looks += 1
            return [1, 2, 3] + ([7] if self.looks >= 5 else [])

    arriving = Arriving()
    assert grid_module.wait_for_nodes(arriving, 3, 60.0, required={1, 7}) == [1, 2, 3, 7]
    assert arriving.looks == 5  # three nodes were enough in number, not the bound one
    assert grid_module.wait_for_nodes(Arriving(), 3, 60.0) == [1, 2, 3]  # no binding: at once
    never = grid_module.wait_for_nodes(Arriving(), 3, 1.0, required={9})
    assert never == [1, 2, 3] and clock.now >= 1.0  # gave up at the timeout


class WindowGrid:
    """Answers each message on the second pull after its push; records how many were
    outstanding at each pull, and never answers node 101 (a silent node)."""

    def __init__(self) -> None:
        self.pushed: dict[str, tuple[Message, int]] = {}
        self.pulls, self.outstanding = 0, []

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for message in messages:
            mid = f"m{len(self.pushed)}"
            message.metadata.__dict__["_message_id"] = mid
            self.pushed[mid] = (message, self.pulls)
            ids.append(mid)
        return ids

    def pull_messages(self, ids: Any) -> list[Message]:
        self.pulls += 1
        ids = list(ids)
        self.outstanding.append(len(ids))
        return [
            Message(RecordDict(), reply_to=msg)
            for mid in ids
            for msg, at in [self.pushed[mid]]
            if self.pulls - at >= 2 and msg.metadata.dst_node_id != 101
        ]


def test_in_flight_bounds_the_outstanding_instructions() -> None:
    messages = [Message(RecordDict(), dst_node_id=100 + i, message_type="train") for i in range(7)]
    grid = WindowGrid()
    replies = send_and_receive(grid, messages, timeout=0.3, poll=0.01, in_flight=2)
    answered = sorted(r.metadata.src_node_id for r in replies)
    assert answered == [100, 102, 103, 104, 105, 106]  # all but the silent node, which timed out
    assert len(grid.pushed) == 7 and max(grid.outstanding) == 2
    everything = WindowGrid()
    send_and_receive(everything, messages[:3], timeout=0.3, poll=0.01)
    assert everything.outstanding[0] == 3  # in_flight=0: all pushed at once
    assert ServerSettings.from_run_config({"in-flight": 4}).in_flight == 4
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=r"in-flight: expected an integer >= 0"):
            ServerSettings.from_run_config({"in-flight": bad})


def test_a_receive_instruction_carries_its_bounded_schedule() -> None:
    from oneshotfl.flower.messages import Instruction, instruction_content, read_instruction

    sent = Instruction("receive", "fol", "fol", 0, {"clients": 4}, {}, ((1,), (2, 3)))
    assert read_instruction(instruction_content(sent)) == sent
    for bad in (((5,),), ((1,), (-1,))):
        content = instruction_content(dataclasses.replace(sent, schedule=bad))
        with pytest.raises(MessageError, match="schedule"):
            read_instruction(content)


def test_a_batched_instruction_is_bounded_and_only_for_round_0() -> None:
    """A batch is at most MAX_BATCH (key, spec) pairs of short strings, and only a round-0
    update without payloads carries one: anything else is refused before a method is built."""
    from oneshotfl.flower.messages import (
        MAX_BATCH,
        Instruction,
        instruction_content,
        read_instruction,
    )

    sent = Instruction(
        "update", "fedavg", "fedavg", 0, {"clients": 4}, {}, (), (("e", "ensemble"),)
    )
    assert read_instruction(instruction_content(sent)) == sent
    too_many = tuple((f"k{i}", "fedavg") for i in range(MAX_BATCH + 1))
    for bad in (too_many, (("k", ""),), (("k", "x" * 1001),)):
        content = instruction_content(dataclasses.replace(sent, batch=bad))
        with pytest.raises(MessageError, match="batch: expected at most"):
            read_instruction(content)
    content = instruction_content(sent)
    content.config_records[INSTRUCTION]["batch"] = '[["k", 3]]'
    with pytest.raises(MessageError, match="batch: expected at most"):
        read_instruction(content)
    for late in (dataclasses.replace(sent, round=1), dataclasses.replace(sent, step="receive")):
        with pytest.raises(MessageError, match="only a round-0 update"):
            read_instruction(instruction_content(late))
    with_payload = dataclasses.replace(sent, payloads={"server": b"x"})
    with pytest.raises(MessageError, match="only a round-0 update"):
        read_instruction(instruction_content(with_payload))


@pytest.mark.parametrize(
    "overrides",
    [
        {  # statistics; the solvers at 100 steps, the true Fisher on 128 examples (not all)
            "methods": [
                "fedfisher:fisher_examples=128:steps=100",
                "regmean",
                "fedlpa:cg_steps=100",
            ],
            "model": "mlp",
            "clients": 3,
        },
        {  # float16 mixtures; the server's head in 200 steps (not 5000), at 0.74, far from chance
            "methods": ["fedpft:epochs=1:lr=0.03:min_steps=200"],
            "encoder": "random:dim=16",
            "clients": 3,
        },
        # class statistics, each head's own
        {"methods": ["ghofl", "ghofl:head=nb", "ghofl:head=qda"], "encoder": "random:dim=16"},
        {"methods": ["dedes"], "clients": 4, "val_fraction": 0.2},  # a score scalar, a team
        {"methods": ["fedd3:server_epochs=20:kip_steps=50"], "clients": 3},  # distilled data
        {"methods": ["fens:rounds=5:eval_every=2"], "clients": 3},  # models, then a few rounds
    ],
    ids=["merging", "fedpft", "ghofl", "dedes", "fedd3", "fens"],
)
def test_issue_43s_methods_on_flower_equal_the_local_simulation(
    tiny_config: Any, tmp_path: Path, overrides: dict[str, Any]
) -> None:
    """What each new family sends crosses the wire, is checked there, and the server builds
    the same result as locally (DeDES: the same team)."""
    cfg = tiny_config(**overrides)
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    flower = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients))
    assert core(flower) == core(local)
    for a, b in zip(local["methods"], flower["methods"], strict=True):
        assert a["diagnostics"].get("team") == b["diagnostics"].get("team")
