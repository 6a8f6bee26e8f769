"""Clients trained together before their updates (``client_batch > 1``), in process.

Before round 0's client steps, :func:`train_ahead` asks the method for the recipe each
client's update trains (:meth:`~oneshotfl.protocol.contract.Method.client_recipe`), trains the
stackable ones that are not cached yet in chunks of ``client_batch`` clients
(:func:`oneshotfl.training.vectorised.train_together`), and hands each model to its own
client's store (:func:`~oneshotfl.training.services.offer_model`). The client steps then run
as always — the same ``client_update``, payload and wire — and find their model trained; each
client is charged its share of its chunk's seconds. What cannot be stacked (components,
pruning, BatchNorm, a method that names no recipe) trains in the client step, one client
after another, as with ``client_batch=1``; so does a client whose stacked training failed,
which then reports its failure as it always does.

:func:`diagnose_together` does the same for the per-client diagnostics: each client's own
model checked on the diagnostic sample of the test split and on its validation split,
every model of one architecture in one vectorised pass, handed to the client's store so the
client step's :func:`~oneshotfl.runner.transport.local_stats` finds them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from oneshotfl.models.stacked import stacked_logits
from oneshotfl.protocol.contract import ClientContext, Method, PeerMethod
from oneshotfl.runner.transport import (
    ClientReply,
    LocalTransport,
    Missing,
    PeerReport,
    offer_stats,
    torch_threads,
)
from oneshotfl.training.recipe import initial_model
from oneshotfl.training.services import model_ready, offer_model
from oneshotfl.training.vectorised import Job, Trained, stackable, train_together

if TYPE_CHECKING:
    from oneshotfl.runner.federation import Federation
    from oneshotfl.runner.plan import Schedules

log = logging.getLogger(__name__)


def train_ahead(
    fed: Federation, method: Method[Any], client_ids: Sequence[int]
) -> dict[int, tuple[ClientContext, nn.Module]]:
    """Train round 0's recipes of ``client_ids`` together (see the module docs); returns the
    clients whose models were trained here, with their contexts and models."""
    cfg = fed.cfg
    if cfg.client_batch <= 1:
        return {}
    jobs: list[Job] = []
    contexts: dict[int, ClientContext] = {}
    why_not: dict[tuple[object, ...], str | None] = {}
    for cid in client_ids:
        try:
            ctx = fed.client_context(cid)
            recipe = method.client_recipe(ctx)
        except Exception:  # the client step meets it again and reports it
            continue
        if recipe is None or model_ready(ctx, recipe):
            continue
        kind = (recipe.arch, recipe.extra_outputs, bool(recipe.components), recipe.pruning)
        if kind not in why_not:
            model = initial_model(recipe.arch, ctx.task, ctx.seed, recipe.extra_outputs)
            why_not[kind] = stackable(recipe, model)
            if why_not[kind]:
                log.info("%s: clients train one at a time: %s", method.name, why_not[kind])
        if why_not[kind] is None:
            contexts[cid] = ctx
            jobs.append(Job(cid, recipe, ctx.data))
    if not jobs:
        return {}
    with torch_threads(cfg.client_threads):
        trained = train_together(
            jobs, fed.data.task, seed=cfg.seed, device=fed.device,
            client_batch=cfg.client_batch, tracker=fed.tracker,
        )  # fmt: skip
    done: dict[int, tuple[ClientContext, nn.Module]] = {}
    for job in jobs:
        result = trained.get(job.client_id)
        if isinstance(result, Trained):
            ctx = contexts[job.client_id]
            offer_model(ctx, job.recipe, result.model, result.steps, result.seconds)
            done[job.client_id] = (ctx, result.model)
        elif result is not None:
            log.info("client %d: trains alone (%s)", job.client_id, result)
    return done


def diagnose_together(fed: Federation, trained: dict[int, tuple[ClientContext, nn.Module]]) -> None:
    """The diagnostics of the models :func:`train_ahead` trained: one vectorised pass per
    architecture over the diagnostic sample, handed to each client's store (see the module
    docs)."""
    if not trained:
        return
    test = fed.diagnostics
    ids = sorted(trained)
    with torch_threads(fed.cfg.client_threads):
        logits = stacked_logits([trained[c][1] for c in ids], test.x, fed.device)
        for cid, out in zip(ids, logits, strict=True):
            ctx, model = trained[cid]
            offer_stats(model, ctx, test, out)


@dataclass(frozen=True)
class BatchedTransport:
    """The in-process transport with ``client_batch > 1``: round 0's stackable recipes
    trained together and their diagnostics computed together (:func:`train_ahead`,
    :func:`diagnose_together`), then every client step as :class:`LocalTransport` runs it."""

    federation: Federation

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[Iterable[ClientReply], Missing]:
        fed = self.federation
        if round_index != 0:
            return LocalTransport(fed).upload(key, method, round_index, broadcast)
        ids = [shard.client_id for shard in fed.data.clients]
        trained = train_ahead(fed, method, ids)
        start = time.perf_counter()
        diagnose_together(fed, trained)
        share = (time.perf_counter() - start) / max(1, len(trained))  # each checked client's
        replies, missing = LocalTransport(fed).upload(key, method, round_index, broadcast)
        return (
            dataclasses.replace(r, diagnostics_s=r.diagnostics_s + share)
            if r.client_id in trained
            else r
            for r in replies
        ), missing

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        return LocalTransport(self.federation).relay(key, method, routes, schedules)


__all__ = ["BatchedTransport", "diagnose_together", "train_ahead"]
