"""A test double for Flower's Grid that answers with the real ClientApp handler, and the
fixture Flower's message stamping needs (shared by the Flower tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from oneshotfl.flower.app import client_main
from oneshotfl.flower.server import run_server
from oneshotfl.runner.config import ExperimentConfig

Tamper = Callable[[int, Message, Message], Message | None]


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    """Flower stamps messages with the running task's identity; the runtime sets it."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class FakeGrid:
    """Nodes ``100 + partition id``, each answering with the real ClientApp handler.

    ``tamper(node, instruction, reply)`` may replace a reply or drop it (``None``: the node
    is silent). With ``nodes`` (a cohort run) there are that many nodes, with the
    ``num-partitions`` Flower's simulation engine gives them.
    """

    def __init__(self, clients: int, tamper: Tamper | None = None, nodes: int = 0) -> None:
        self.node_config: dict[int, dict[str, Any]] = {
            100 + p: {"partition-id": p} | ({"num-partitions": nodes} if nodes else {})
            for p in range(nodes or clients)
        }
        self.tamper = tamper
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self.waiting: dict[str, Message] = {}  # message id -> its reply, until pulled
        self.pulls = 0

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_config)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Each node answers at once; the replies wait to be pulled, as on a SuperLink."""
        ids = []
        for message in messages:
            message_id = f"m{len(self.sent)}"
            message.metadata.__dict__["_message_id"] = message_id  # as Grids do
            self.sent.append(message)
            ids.append(message_id)
            node = message.metadata.dst_node_id
            ctx = Context(1, node, self.node_config[node], RecordDict(), {})
            reply: Message | None = client_main(message, ctx)
            if self.tamper is not None and reply is not None:
                reply = self.tamper(node, message, reply)
            if reply is not None:
                self.waiting[message_id] = reply
                self.replies.append(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        return [self.waiting.pop(i) for i in list(message_ids) if i in self.waiting]


def core(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (m["key"], m["accuracy"], m["personal_accuracy"], m["upload_bytes_per_client"])
        for m in doc["methods"]
    ]


def run_on_grid(
    tmp_path: Path,
    cfg: ExperimentConfig,
    grid: FakeGrid,
    name: str = "out",
    batch: bool = True,
    cohort: int = 0,
) -> Any:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    run_config: dict[str, Any] = {"config": str(config), "out": str(tmp_path / name)}
    run_config |= {"node-timeout": 1.0, "batch-updates": batch, "cohort-size": cohort}
    run_config["reply-timeout"] = 1.0  # the nodes answer at once; a silent one costs 1 s
    return run_server(grid, run_config, "test")
