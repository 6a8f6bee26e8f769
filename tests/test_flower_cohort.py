"""Cohorts on Flower (issue 53): one message per node carries several virtual clients, the
result equals the local run and the one-client-per-message run, and a bad client, a bad
cohort or a dying node costs only its own clients, each named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict  # noqa: E402

import toys  # noqa: E402
from fakegrid import FakeGrid, core, run_on_grid, task_identity  # noqa: E402, F401
from helpers import registered, run_config  # noqa: E402
from oneshotfl.flower.app import client_main  # noqa: E402
from oneshotfl.flower.batch import COHORT, FAILED  # noqa: E402
from oneshotfl.flower.cohort import (  # noqa: E402
    cohort_reply_content,
    held_clients,
    read_cohort_reply,
)
from oneshotfl.flower.messages import (  # noqa: E402
    INSTRUCTION,
    PAYLOADS,
    REPLY,
    Instruction,
    MessageError,
    bytes_record,
    instruction_content,
    read_instruction,
    record_bytes,
)
from oneshotfl.flower.node import NodeIdentity  # noqa: E402
from oneshotfl.flower.server import ServerSettings, run_server  # noqa: E402
from oneshotfl.payload import Payload, decode, encode  # noqa: E402
from oneshotfl.runner.config import ConfigError  # noqa: E402
from oneshotfl.runner.transport import ClientReply  # noqa: E402


def _clients(message: Message) -> Any:
    text = message.content.config_records[INSTRUCTION]["clients"]
    return None if text == "" else json.loads(str(text))


def test_cohorts_give_the_local_and_the_one_client_per_message_result(
    tiny_config: Any, tmp_path: Path
) -> None:
    """5 clients in cohorts of at most 2: 3 nodes holding {0, 3}, {1, 4} and {2}; one message
    per node for every method's round 0, then one per node per later round."""
    methods = ["local", "fedavg", "ensemble", "fedavg_rounds:rounds=2"]
    cfg = tiny_config(methods=methods, clients=5)
    local = run_config(cfg)
    nodes = dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes"))
    single = run_on_grid(tmp_path, nodes, FakeGrid(cfg.clients), name="single")
    grid = FakeGrid(cfg.clients, nodes=3)
    cohort = run_on_grid(tmp_path, nodes, grid, name="cohort", cohort=2)
    assert core(cohort) == core(local) == core(single)
    assert cohort["clients"] == local["clients"]
    assert cohort["flower"]["cohorts"] == {"100": [0, 3], "101": [1, 4], "102": [2]}
    assert cohort["flower"]["cohort_size"] == 2 and cohort["flower"]["no_reply"] == {}
    assert single["flower"]["cohorts"] == {}
    assert len(grid.sent) == 3 * (1 + 2)
    # the first message asks each node for every client it holds, later ones name them
    first, later = grid.sent[:3], grid.sent[3:]
    assert all(_clients(m) == [] for m in first)
    assert sorted(map(tuple, (_clients(m) for m in later))) == sorted([(0, 3), (1, 4), (2,)] * 2)


def test_a_peer_method_in_cohorts_equals_the_local_simulation(
    tiny_config: Any, tmp_path: Path
) -> None:
    with registered("toy_average", toys.NeighbourAverage):
        cfg = tiny_config(methods=["peer_ensemble", "toy_average"], graph="ring:k=1", clients=4)
        local = run_config(cfg)
        grid = FakeGrid(cfg.clients, nodes=2)
        flower = run_on_grid(
            tmp_path, dataclasses.replace(cfg, cache_dir=str(tmp_path / "nodes")), grid, cohort=2
        )
    assert core(flower) == core(local)
    for a, b in zip(local["methods"], flower["methods"], strict=True):
        for name in ("client_accuracy", "client_personal_accuracy", "topology", "rejected"):
            assert a[name] == b[name], name
    # one update message per node, then per method one receive message per node holding
    # each receiver's senders under r<receiver>/client-<sender>
    assert len(grid.sent) == 2 + 2 * 2
    receive = next(m for m in grid.sent[2:] if m.metadata.dst_node_id == 100)
    assert _clients(receive) == [0, 2]
    names = set(record_bytes(receive.content.array_records[PAYLOADS]))
    assert names == {"r0/client-1", "r0/client-3", "r2/client-1", "r2/client-3"}


def test_a_bad_client_in_a_cohort_is_rejected_and_named_and_the_others_stay(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Node 101 holds clients 1 and 3: client 3's payload is NaN (rejected on validation,
    named), client 1's entry failed on the node (named): clients 0 and 2 aggregate."""
    cfg = tiny_config(methods=["fedavg"], clients=4, min_clients=2)

    def tamper(node: int, instruction: Message, reply: Message) -> Message | None:
        if node != 101:
            return reply
        name = f"{PAYLOADS}.1"
        blobs = record_bytes(reply.content.array_records[name])
        payload = decode(blobs["client-3"])
        arrays = {
            k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v
            for k, v in payload.arrays.items()
        }
        reply.content[name] = bytes_record({"client-3": encode(Payload(arrays, payload.scalars))})
        del reply.content[f"{REPLY}.0"], reply.content[f"{PAYLOADS}.0"]
        reply.content[f"{FAILED}.0"] = ConfigRecord({"reason": "ValueError: disk full"})
        return reply

    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=tamper, nodes=2), cohort=2)
    method = doc["methods"][0]
    assert method["clients_used"] == [0, 2]
    assert "disk full" in method["no_reply"]["node 101 (client 1)"]
    assert "finite" in method["rejected"]["3"]


def test_a_node_dying_costs_only_its_cohorts_unanswered_clients(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Node 101 (clients 1 and 4) answers the round 0 of every method, then dies in the
    second round of fedavg_rounds: that round names its two clients; what came before stays."""
    cfg = tiny_config(methods=["fedavg", "fedavg_rounds:rounds=2"], clients=5, min_clients=2)

    def tamper(node: int, instruction: Message, reply: Message) -> Message | None:
        round_index = instruction.content.config_records[INSTRUCTION]["round"]
        if node == 101 and round_index == 1:
            return Message(Error(code=1, reason="worker died"), reply_to=instruction)
        return reply

    doc = run_on_grid(tmp_path, cfg, FakeGrid(cfg.clients, tamper=tamper, nodes=3), cohort=2)
    fedavg, rounds = doc["methods"]
    assert fedavg["clients_used"] == [0, 1, 2, 3, 4] and not fedavg.get("no_reply")
    assert rounds["clients_used"] == [0, 2, 3]
    for cid in (1, 4):
        assert "worker died" in rounds["no_reply"][f"node 101 (client {cid})"]
    assert doc["flower"]["no_reply"][rounds["key"]] == rounds["no_reply"]


def test_a_node_failing_its_first_answer_is_named_with_its_clients(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Before a node's first answer the server does not know its clients: the node is named,
    and so is each client no node answered for."""
    cfg = tiny_config(methods=["fedavg"], clients=4, min_clients=2)
    grid = FakeGrid(cfg.clients, nodes=2, tamper=lambda n, _, r: None if n == 100 else r)
    method = run_on_grid(tmp_path, cfg, grid, cohort=2)["methods"][0]
    assert method["clients_used"] == [1, 3]
    # a cohort message waits reply-timeout (1 s here) times cohort-size
    assert "no reply within 2 s" in method["no_reply"]["node 100 (cohort)"]
    assert method["no_reply"]["client 0"] == method["no_reply"]["client 2"] == "no reply"


def test_a_cohort_larger_than_cohort_size_or_claimed_twice_is_refused(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Two SuperNodes for 5 clients in cohorts of 2: node 100 holds 0, 2 and 4, one more
    than cohort-size, and is refused, named; then two nodes that both hold clients 0 and 2:
    the second to answer is refused, naming the node that answers for them."""
    cfg = tiny_config(methods=["fedavg"], clients=5, min_clients=1)
    method = run_on_grid(tmp_path, cfg, FakeGrid(5, nodes=2), name="big", cohort=2)["methods"][0]
    assert method["clients_used"] == [1, 3]
    why = method["no_reply"]["node 100 (cohort)"]
    assert "answered for 3 clients, more than cohort-size 2" in why and "= 3 SuperNodes" in why
    twins = FakeGrid(4, nodes=2)
    twins.node_config[101] = {"partition-id": 0, "num-partitions": 2}
    cfg = tiny_config(methods=["fedavg"], clients=4, min_clients=1)
    method = run_on_grid(tmp_path, cfg, twins, name="twins", cohort=2)["methods"][0]
    assert method["clients_used"] == [0, 2]
    assert "clients [0, 2], which node 100 answers for" in method["no_reply"]["node 101 (cohort)"]
    assert method["no_reply"]["client 1"] == "no reply"


def test_a_cohort_relay_takes_only_its_receivers_payloads(tiny_config: Any) -> None:
    cfg = tiny_config(methods=["peer_ensemble"], clients=4, graph="complete")
    node = {"partition-id": 0, "num-partitions": 2}  # holds 0 and 2
    for name in ("client-1", "r1/client-0", "r0/peer-1"):
        instruction = Instruction(
            "receive", "peer_ensemble", "peer_ensemble", 0, cfg.to_dict(), {name: b"x"},
            clients=(0, 2),
        )  # fmt: skip
        message = Message(instruction_content(instruction), dst_node_id=100, message_type="train.x")
        with pytest.raises(ConfigError, match=r"r<receiver>/client-<id>|client-<id>"):
            _answer(message, node)


def _instruction(cfg: Any, clients: tuple[int, ...] | None, **kw: Any) -> Message:
    instruction = Instruction(
        "update", "fedavg", "fedavg", 0, cfg.to_dict(), {}, clients=clients, **kw
    )
    return Message(instruction_content(instruction), dst_node_id=100, message_type="train.x")


def _answer(message: Message, node_config: dict[str, Any]) -> Message:
    return client_main(message, Context(1, 100, node_config, RecordDict(), {}))


def test_a_cohort_naming_clients_the_node_does_not_hold_is_refused_naming_them(
    tiny_config: Any,
) -> None:
    cfg = tiny_config(methods=["fedavg"], clients=4)
    node = {"partition-id": 0, "num-partitions": 2}  # holds 0 and 2
    with pytest.raises(ConfigError, match=r"c ≡ 0 \(mod 2\).*asked for clients 1, 3"):
        _answer(_instruction(cfg, (0, 1, 3)), node)
    with pytest.raises(ConfigError, match="a cohort needs num-partitions"):
        _answer(_instruction(cfg, ()), {"partition-id": 0})
    own = NodeIdentity(0, 2, dataset="npz:path=mine.npz")
    with pytest.raises(ConfigError, match="its own dataset holds one client"):
        held_clients(own, 4)
    reply = _answer(_instruction(cfg, (2,)), node)
    clients, (row,) = read_cohort_reply(reply.content, 1, (2,), 4)
    assert clients == (2,) and isinstance(row[0], ClientReply) and row[0].client_id == 2


@pytest.mark.parametrize(
    "clients",
    ["[0, 0]", "[4]", "[-1]", '["0"]', "[true]", "{}", "[0, 1, 2, 3, 0]"],
)
def test_a_cohort_instruction_is_bounded(tiny_config: Any, clients: str) -> None:
    cfg = tiny_config(methods=["fedavg"], clients=4)
    message = _instruction(cfg, ())
    message.content.config_records[INSTRUCTION]["clients"] = clients
    with pytest.raises(MessageError, match="expected a list of distinct client ids below 4"):
        read_instruction(message.content)


def test_a_cohort_answer_for_other_clients_is_malformed() -> None:
    reply = ClientReply(3, b"x", 0.0)
    content = cohort_reply_content([1, 3], [["failed: ?", reply]])
    assert read_cohort_reply(content, 1, None, 4)[0] == (1, 3)
    with pytest.raises(MessageError, match=r"asked for clients \[3\], answered for \[1, 3\]"):
        read_cohort_reply(content, 1, (3,), 4)
    with pytest.raises(MessageError, match="distinct client ids below 2"):
        read_cohort_reply(content, 1, None, 2)
    content[COHORT] = ConfigRecord({"clients": "[1]"})  # entries of a client not listed
    with pytest.raises(MessageError, match=r"expected records of entries 0\.\.0"):
        read_cohort_reply(content, 1, None, 4)


def test_cohorts_are_refused_in_a_deployment_and_with_a_binding(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cohort-size: expected an integer >= 0, got -1"):
        ServerSettings.from_run_config({"cohort-size": -1})
    with pytest.raises(ConfigError, match="cohort-size is for Flower's simulation engine"):
        ServerSettings.from_run_config({"cohort-size": 10, "node-clients": "7=0"})
    with pytest.raises(ConfigError, match="a deployment keeps one client per SuperNode"):
        run_server(FakeGrid(2), {"cohort-size": 10, "out": str(tmp_path / "o")}, "deployment")
