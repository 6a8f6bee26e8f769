"""The run: the one orchestrator of an experiment, the same in simulation and over Flower.

:func:`run_experiment` executes a checked :class:`~oneshotfl.runner.plan.Plan`: it prepares
the :class:`~oneshotfl.runner.federation.Federation`, connects a transport (in process, the
worker pool, or Flower's Grid through ``connect``), runs each method with the engine
(:func:`~oneshotfl.runner.engine.run_method`) on the server's view and a ledger of the
clients' reports, and returns the result document. Only the Python API (:mod:`oneshotfl.api`)
and the Flower ServerApp (:mod:`oneshotfl.flower.server`) call it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oneshotfl.data.types import Dataset
from oneshotfl.runner.accounting import attribute_client_time
from oneshotfl.runner.engine import run_method
from oneshotfl.runner.errors import clip, first_line
from oneshotfl.runner.federation import Federation, ServerView
from oneshotfl.runner.ledger import Ledger
from oneshotfl.runner.plan import Plan
from oneshotfl.runner.pool import open_transport
from oneshotfl.runner.results import MethodResult, result_document
from oneshotfl.runner.transport import Transport, torch_threads
from oneshotfl.training.memo import memoised_logits
from oneshotfl.training.progress import Tracker

log = logging.getLogger(__name__)

Connect = Callable[[Federation, Plan], Transport]
"""Given the prepared federation and its plan, the transport to run the methods over."""


def warn_at_chance(result: MethodResult, classes: int) -> None:
    """Log a warning when a method ends at chance (its own metric — personal accuracy for a
    server-free method — below 1.5 / classes): usually an undertrained budget."""
    peer = result.topology is not None
    value = result.personal_accuracy if peer else result.accuracy
    if value is not None and classes > 1 and value < 1.5 / classes:
        log.warning(
            "%s ended at chance: %.1f%% with %d classes (chance %.1f%%); a budget this small "
            "may not train it (local_steps, local_epochs, lr, server_steps)",
            result.key, 100 * value, classes, 100 / classes,
        )  # fmt: skip


def failure_reason(exc: BaseException, limit: int = 400) -> str:
    """One line saying why a method failed: the error's type and the first line of its
    message (at most ``limit`` characters)."""
    first = first_line(exc)
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return clip(text, limit)


@dataclass(frozen=True)
class Ran:
    """What running a plan's methods gave: the results of those that finished, the ones
    that failed (key → one-line reason), the server's view and the ledger they filled."""

    results: list[MethodResult]
    failed: dict[str, str]
    view: ServerView
    ledger: Ledger


def run_methods(
    plan: Plan,
    federation: Federation,
    transport: Transport,
    save_to: Path | None = None,
    after_each: Callable[[Ran], None] | None = None,
) -> Ran:
    """Run the plan's methods in order over ``transport`` (they share trained client
    artefacts). A method that fails — too few valid answers, an error in its server step or
    its evaluation — is recorded with its one-line reason (the traceback goes to the debug
    log) and the others go on: one failing method never costs the others' results.
    ``after_each`` sees what ran so far after each method (finished or failed)."""
    view = federation.server_view(save_to)
    ledger = Ledger(plan.cfg.clients, view.task.num_classes)
    results: list[MethodResult] = []
    failed: dict[str, str] = {}
    with memoised_logits(view.test.x) as memo:  # each model runs over the test once
        for key, method in plan.methods:
            log.info("running %s", key)
            try:
                with torch_threads(plan.cfg.server_threads):  # client steps set their own
                    results.append(run_method(key, method, view, transport, ledger))
            except Exception as exc:  # recorded; the run goes on with the next method
                failed[key] = failure_reason(exc)
                log.error("%s failed: %s", key, failed[key])
                log.debug("%s failed", key, exc_info=True)
            else:
                warn_at_chance(results[-1], view.task.num_classes)
            if after_each is not None:
                after_each(Ran(results, failed, view, ledger))
    stats = memo()
    log.debug("test logits: %d models run, %d answers memoised", stats.misses, stats.hits)
    return Ran(results, failed, view, ledger)


def run_experiment(
    plan: Plan,
    tracker: Tracker | None = None,
    connect: Connect | None = None,
    save_to: Path | None = None,
    dataset: Dataset | None = None,
    lazy: bool = False,
    partial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every method of ``plan`` on one federation; return the result document.
    ``lazy``: the clients' shards are held as indices (the ServerApp, which never trains
    on them; :meth:`Federation.prepare`). ``partial``: given, after each method but the
    last, the document of what ran so far, with ``partial.pending`` naming the methods still
    to run (the ServerApp writes it, so that a run cut short keeps what finished).

    The sequence is the same everywhere: prepare the federation, connect a transport
    (``connect``; default: in process or the worker pool), run, document. The plan was
    checked by :func:`~oneshotfl.runner.plan.preflight`; nothing is checked twice.
    """
    started, t0 = datetime.now(UTC), time.perf_counter()
    federation = Federation.prepare(plan, tracker, dataset, lazy)
    keys = [key for key, _ in plan.methods]

    def so_far(ran: Ran) -> None:
        done = len(ran.results) + len(ran.failed)
        if partial is None or done >= len(keys):
            return
        attributed, shared = attribute_client_time(ran.results)
        doc = result_document(
            ran.view, ran.ledger, attributed, started, t0, 1, shared, failed=ran.failed
        )
        partial(doc | {"partial": {"pending": keys[done:]}})

    if connect is not None:
        transport = connect(federation, plan)
        ran, workers = run_methods(plan, federation, transport, save_to, so_far), 1
    else:
        with open_transport(federation) as (transport, workers):  # in process, or workers
            ran = run_methods(plan, federation, transport, save_to, so_far)
    attributed, shared = attribute_client_time(ran.results)
    return result_document(
        ran.view, ran.ledger, attributed, started, t0, workers, shared, failed=ran.failed
    )
