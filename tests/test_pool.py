"""Clients in parallel (``workers``): the same result for any number of worker processes, and
the in-process transport's failure semantics — a client that raises, or a worker that dies, is
named and the run goes on."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from helpers import registered, run_config
from oneshotfl.methods.fedavg import FedAvg
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.outcome import Outcome
from oneshotfl.runner import pool
from oneshotfl.runner.compare import result_differences
from oneshotfl.runner.pool import resolve_workers, start_method

METHODS = [
    "local",
    "fedavg",
    "ensemble",
    "fedov:fgsm_steps=1",
    "fedeov_pruned:fgsm_steps=1:fgsm_warmup_steps=1",
    "peer_ensemble",
    "fol:kd_epochs=1:finetune_epochs=1:prune_epochs=1:post_epochs=1",
]


def test_results_are_bit_identical_for_any_number_of_workers(tiny_config: Any) -> None:
    """Client c runs in worker c % workers: three workers on four clients take every path
    two did (a worker holds two clients, one after the other; the others one each, unevenly:
    {0, 3}, {1}, {2}), so one pool run against the run in process."""
    docs = {}
    for workers in (1, 3):
        cfg = tiny_config(
            clients=4, methods=METHODS, workers=workers, val_fraction=0.2, local_epochs=2,
            cache_dir="",
        )  # fmt: skip
        docs[workers] = run_config(cfg)
    assert result_differences(docs[1], docs[3]) == []
    assert docs[3]["cache"] == docs[1]["cache"]  # the workers' hits are counted
    assert docs[3]["environment"]["workers"] == 3
    assert docs[1]["environment"]["workers"] == 1


class FailsOnClientOne(FedAvg):
    """FedAvg whose client 1 raises in its update."""

    name = "fails_on_one"

    def client_update(self, ctx: ClientContext) -> Payload:
        if ctx.client_id == 1:
            raise RuntimeError("client one's disk is full")
        return super().client_update(ctx)


class DiesOnClientOne(FedAvg):
    """FedAvg whose client 1 kills its own process (a worker that dies)."""

    name = "dies_on_one"

    def client_update(self, ctx: ClientContext) -> Payload:
        if ctx.client_id == 1 and os.getpid() != PARENT:
            os._exit(3)
        return super().client_update(ctx)


PARENT = os.getpid()


def test_a_client_that_fails_in_a_worker_is_named_and_the_run_goes_on(tiny_config: Any) -> None:
    with registered("fails_on_one", FailsOnClientOne):
        doc = run_config(tiny_config(clients=4, methods=["fails_on_one", "fedavg"], workers=2))
    failed, plain = doc["methods"]
    assert "client one's disk is full" in failed["no_reply"]["client 1"]
    assert set(failed["no_reply"]) == {"client 1"} and 0.0 <= failed["accuracy"] <= 1.0
    assert "no_reply" not in plain  # the worker that held client 1 still works


def test_a_worker_that_dies_names_its_clients_and_is_replaced(tiny_config: Any) -> None:
    with registered("dies_on_one", DiesOnClientOne):
        doc = run_config(tiny_config(clients=4, methods=["dies_on_one", "fedavg"], workers=2))
    died, plain = doc["methods"]
    assert "BrokenProcessPool" in died["no_reply"]["client 1"]
    assert "client 0" not in died["no_reply"] and "client 2" not in died["no_reply"]
    assert "no_reply" not in plain and plain["accuracy"] > 0.5  # the next method: a new worker


def test_a_method_that_cannot_be_sent_to_a_worker_runs_in_process(
    tiny_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Local(FedAvg):  # defined in a function: not picklable
        name = "local_class"

        def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
            return super().aggregate(payloads, ctx)

    with registered("local_class", Local):
        doc = run_config(tiny_config(clients=3, methods=["local_class", "fedavg"], workers=2))
    assert [m.get("no_reply") for m in doc["methods"]] == [None, None]
    assert doc["methods"][0]["accuracy"] == doc["methods"][1]["accuracy"]
    assert "cannot be sent to worker processes" in caplog.text


def test_the_number_of_workers() -> None:
    budget = torch.get_num_threads()
    assert resolve_workers(3, clients=10, client_thread_count=1, gpu=False) == 3
    assert resolve_workers(8, clients=5, client_thread_count=1, gpu=False) == 5  # one per client
    assert resolve_workers(0, clients=100, client_thread_count=1, gpu=False) == budget
    assert resolve_workers(0, clients=100, client_thread_count=1, gpu=True) == 1
    assert resolve_workers(3, clients=100, client_thread_count=1, gpu=True) == 3  # in flight
    assert resolve_workers(0, clients=100, client_thread_count=None, gpu=False) == 1


def test_a_worker_that_died_between_steps_is_replaced_at_the_next_submit(
    tiny_config: Any,
) -> None:
    import signal
    import time

    from helpers import prepare
    from oneshotfl.methods import build_method
    from oneshotfl.runner.pool import PoolTransport

    exp = prepare(tiny_config(clients=4, methods=["fedavg"], workers=2, cache_dir=""))
    pool = PoolTransport(exp, 2)
    try:
        first, missing = pool.upload("fedavg", build_method("fedavg"), 0, None)
        assert len(first) == 4 and not missing
        dead = pool._slots[0]
        for pid in list(dead._processes):  # type: ignore[attr-defined]
            os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # until the executor has noticed
            if dead._broken:  # type: ignore[attr-defined]
                break
            time.sleep(0.05)
        again, missing = pool.upload("fedavg", build_method("fedavg"), 0, None)
        assert not missing and len(again) == 4  # its clients ran in a new worker
        assert pool._slots[0] is not dead
    finally:
        pool.close()


@pytest.mark.xdist_group("forkserver")  # one forkserver with test_plugins.py's forkserver test
def test_workers_are_not_forked_where_torch_sees_a_gpu(
    tiny_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: on a machine whose torch sees a CUDA device, the parent's first backward pass
    (SimCLR, a server step) starts the autograd engine's device threads, and every forked
    worker then failed its client update ("Unable to handle autograd's threading in
    combination with fork-based multiprocessing"). Torch made to report a GPU: no worker is
    forked, yet the run still uses every client, identical to one run in process."""
    asked: list[str] = []
    real = multiprocessing.get_context

    def spy(method: str | None = None) -> Any:
        asked.append(str(method))
        return real(method)

    settings = {
        "clients": 3,
        "methods": ["fedavg", "ensemble"],
        "cache_dir": "",
        "client_threads": 1,
    }
    alone = run_config(tiny_config(**settings))
    assert start_method(1) == "fork" or not hasattr(os, "fork") or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pool.multiprocessing, "get_context", spy)
    assert start_method(1) != "fork" and start_method(None) != "fork"
    doc = run_config(tiny_config(**settings, workers=2))
    assert asked and "fork" not in asked, asked
    assert all(m["clients_used"] == [0, 1, 2] for m in doc["methods"])
    assert result_differences(alone, doc) == []
