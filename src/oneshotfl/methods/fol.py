"""FOL: Federated Oriented Learning, one-shot personalised learning without a server.

Huang and Shu, "Federated Oriented Learning: A Practical One-Shot Personalized Federated
Learning Framework" (ICML 2025, OpenReview jwjvkWsePB). Every client is a receiver:

1. **Pretrain** — the client trains θ_k^(1)- on its private training split (the federation's
   recipe) and sends it, once, to the graph neighbours it meets (one message per edge).
2. **Collect and align** — in each of E collection rounds (``rounds``) the client meets up to
   Q neighbours (``per_round``; :func:`~oneshotfl.methods.fol_stages.encounter_schedule`,
   drawn from the partition seed; ``contact`` is the chance a neighbour is in range in a
   round). It fine-tunes each received model on its training split (``finetune_epochs``),
   prunes it with alignment-aware structured pruning (``gamma`` = γ, ``lambda_p`` = λ_p,
   ``prune_epochs``, then the ``prune_ratio`` smallest filters and neurons of each layer are
   removed — a smaller dense model) and post-fine-tunes it (``post_epochs``). The objective
   is our reconstruction (see :mod:`oneshotfl.methods.fol_stages`).
3. **Top-K ensemble** — every candidate (the client's current model and every aligned model
   collected so far) is scored on the client's private validation split, ties broken by the
   cosine similarity of its validation predictions to the client's own; the best ``top_k``
   (0: all) form A_w(x) = Σ w_i f_i(x) (logits), w learnt on the simplex (w = softmax(v),
   Adam, ``weight_steps`` full-batch steps at ``weight_lr``) by minimising the ensemble's CE
   on the training split, or uniform (``weights=uniform``).
4. **Regularised distillation** — the client's student θ^(e)+, started from θ^(e)-, minimises
   KL(softmax(A_w/T) ‖ softmax(f/T)) + λ ‖θ^(e)+ − θ^(e)-‖² on its training inputs
   (``temperature`` = T, ``kd_lambda`` = λ, ``kd_epochs``); θ^(e+1)- = θ^(e)+.

The result is θ^(E)+ per client, evaluated on each client's own label distribution. A
received model whose fine-tuning diverges is left out and named in ``diagnostics.dropped``;
one that ``torch.fx`` cannot trace is used unpruned; a candidate with non-finite outputs is
never chosen. A client too small to hold a validation split ranks on its training split.

Variants (presets): ``fol-a`` collects from every neighbour in contact (``per_round=0``, no Q
limit); ``fol-n`` skips the alignment-aware pruning (``prune=false``: fine-tuning only);
``fol-an`` both. Ablations: ``prune=false``, ``weights=uniform``, ``distill=false`` (the
client keeps the last round's weighted ensemble as its model), ``top_k``.

Readings and deviations (the paper gives no hyper-parameters, no schedule and a garbled
pruning formula): one message per client (its pretrained model), so later rounds meet new
neighbours rather than receiving updated models; aligned models are kept across rounds;
the ensemble combines logits, as the paper's softmax(A_w/T) says; λ_p's alignment is the
response correlation of :func:`~oneshotfl.methods.fol_stages.alignment_scores`; KL without
a T² factor, as written. The teacher's weights are fitted on the training split, as the paper
writes (``weight_split=train``); ``weight_split=val`` fits them on the validation split.

At the library's default budget on small shards FOL ends where ``local`` ends: the 300-step
floor lets a client with a few hundred examples fit its training split, the weight fit then
puts nearly all the weight on the own model, and the student is the own model again. Where the
client models do not fit their training split (more data per client, or no step floor) FOL
gains over ``local``; neither other reading helps on small shards
(docs/benchmarks/personalisation.md, "FOL against local at the library's defaults").
A run says so: each receiver records how often its final model predicts as its local model
on its held-out data (``own_agreement``), and where that is >= 99%, or the teacher put >= 99%
of its weight on the own model in every round, the run logs one line naming those clients
and ``result.json`` keeps it in the method's ``notes``.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from oneshotfl.fingerprints import tensor_fingerprint
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import BOTH, SendsTrainedModel, held_out
from oneshotfl.methods.fol_config import FolConfig
from oneshotfl.methods.fol_stages import (
    OWN_AGREEMENT,
    OWN_MASS,
    align_prune,
    encounter_schedule,
    ensemble_weights,
    own_model_receivers,
    prediction_agreement,
    prediction_cosines,
    regularised_distillation,
    top_k,
    validation_scores,
    weighted_logits,
)
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, PeerMethod, Requires, Topology
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome
from oneshotfl.protocol.spec import WireDims
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import TrainConfig, predict_logits, train_classifier
from oneshotfl.training.services import client_artefact, train_model
from oneshotfl.training.structured import StructureError, channel_groups, remove_groups

log = logging.getLogger(__name__)


def _fingerprint(model: nn.Module) -> str:
    return tensor_fingerprint(*model.state_dict().values())


def _pruned_fields(model: nn.Module, keep: Mapping[str, torch.Tensor]) -> Payload:
    keep_arrays = {f"keep.{k}": v.detach().cpu().numpy().astype(np.int64) for k, v in keep.items()}
    return model_fields(model).merged(Payload(keep_arrays))


def _pruned_model(payload: Payload, dims: WireDims) -> nn.Module:
    """Rebuild an aligned model: its architecture, cut to the kept units, then its state."""
    arch = str(payload.scalars["model.arch"])
    with torch.random.fork_rng(devices=[]):
        model: nn.Module = create_model(arch, dims.in_channels, dims.num_classes, dims.image_size)
    keep = {k[5:]: torch.from_numpy(v) for k, v in payload.arrays.items() if k.startswith("keep.")}
    if keep:
        model = remove_groups(model, channel_groups(model), keep)
    state = {
        k[6:]: torch.from_numpy(np.array(v))
        for k, v in payload.arrays.items()
        if k.startswith("model.")
    }
    model.load_state_dict(state, strict=True)
    return model.eval()


@register_method("fol", "FOL: server-free one-shot personalisation (align-prune, top-K, KD)")
class Fol(PeerMethod[FolConfig], SendsTrainedModel[FolConfig]):
    """Each client aligns, prunes and ensembles its neighbours' models, then distils."""

    cost = (
        "clients: one local training each (O(N)); each of n receivers fine-tunes, prunes and "
        "distils its ≤ Q received models: O(n·Q) trainings"
    )

    known_limits = (
        KnownLimit(
            "personalisation with nothing to personalise: on IID data each client's own "
            "distribution is everyone's, and FOL distils its Top-K ensemble into one model, "
            "which stays below the ensemble of all five client models (measured, as FOL is, "
            "on each client's own distribution)",
            below=BOTH,
            partitions=("iid",),
        ),
    )

    Config: ClassVar[type] = FolConfig
    requires: ClassVar[Requires] = Requires(topology=Topology.PEER, validation=True)

    def schedule(
        self, receiver: int, neighbours: Sequence[int], seed: int
    ) -> tuple[tuple[int, ...], ...]:
        c = self.config
        return encounter_schedule(receiver, neighbours, seed, c.rounds, c.per_round, c.contact)

    def _epochs(self, ctx: ClientContext, epochs: int) -> TrainConfig:
        """A stage's settings: the stages continue training a given model, so they run
        exactly their own epochs (no ``local_steps`` floor)."""
        return replace(ctx.train_config, epochs=epochs, min_steps=0)

    def _aligned(
        self, ctx: ClientContext, sender: int, payload: Payload, own: nn.Module
    ) -> tuple[nn.Module, dict[str, float]]:
        """Stage 2 for one received model: fine-tune, align-prune, post-tune (cached)."""
        c = self.config
        parts = {
            "sender": tensor_fingerprint(
                *(torch.from_numpy(np.array(v)) for _, v in sorted(payload.arrays.items()))
            ),
            "own": _fingerprint(own),
            "from": sender,  # the training streams are seeded by the sender's id
            "stage": [c.prune, c.gamma, c.lambda_p, c.prune_ratio, c.probe],
            "epochs": [c.finetune_epochs, c.prune_epochs, c.post_epochs],
            "train": ctx.train_config.as_dict(),
        }

        def make() -> Payload:
            start = time.perf_counter()
            model = model_from_fields(payload, ctx.dims).to(ctx.device)
            gen = torch_generator(ctx.seed, "fol", "align", ctx.client_id, sender)
            tune = self._epochs(ctx, c.finetune_epochs)
            train_classifier(model, ctx.data, tune, gen, ctx.device)
            keep: dict[str, torch.Tensor] = {}
            report: dict[str, float] = {}
            if c.prune and _prunable(model):
                model, keep, report = align_prune(
                    model,
                    own,
                    ctx.data,
                    self._epochs(ctx, c.prune_epochs),
                    gamma=c.gamma,
                    lambda_p=c.lambda_p,
                    ratio=c.prune_ratio,
                    probe=c.probe,
                    generator=gen,
                    device=ctx.device,
                )
                train_classifier(model, ctx.data, self._epochs(ctx, c.post_epochs), gen, ctx.device)
            report["align_seconds"] = time.perf_counter() - start
            return _pruned_fields(model.cpu(), keep).merged(Payload({}, report))

        stored = client_artefact(ctx, "fol_aligned", parts, make, f"FOL aligns client {sender}")
        info = {k: float(v) for k, v in stored.scalars.items() if k != "model.arch"}
        return _pruned_model(stored, ctx.dims).to(ctx.device), info

    def aggregate_for(self, ctx: ClientContext, payloads: Mapping[int, Payload]) -> Outcome:
        c = self.config
        current = train_model(ctx, ctx.recipe())
        if payloads and not ctx.schedule:
            raise ValueError(
                f"fol on client {ctx.client_id}: expected a receiver context with its "
                f"encounter schedule, got none with {len(payloads)} payload(s)"
            )
        windows = ctx.schedule
        local = current  # the client's own model, for the note on what the rounds changed
        dropped: dict[str, str] = {}
        pool: list[tuple[int, nn.Module]] = []
        rounds: list[dict[str, Any]] = []
        seconds: dict[str, float] = {}  # measured when computed (a cache hit repeats them)
        teacher: Ensemble | None = None
        for e, window in enumerate(windows):
            aligned = {}
            for sender in window:
                if sender in payloads:
                    try:
                        model, report = self._aligned(ctx, sender, payloads[sender], current)
                    except Exception as exc:
                        # whatever one neighbour's model raises excludes that model only, named
                        dropped[str(sender)] = f"{type(exc).__name__}: {exc}"
                        log.warning(
                            "client %d: left out the model of client %d: %s",
                            ctx.client_id,
                            sender,
                            dropped[str(sender)],
                        )
                        continue
                    pool.append((sender, model))
                    seconds[f"align {sender}"] = report.pop("align_seconds")
                    aligned[str(sender)] = report
            candidates = [(ctx.client_id, current), *pool]
            chosen, weights, scores = self._ensemble(ctx, [m for _, m in candidates])
            entry = {
                "met": list(window),
                "aligned": aligned,
                "candidates": [s for s, _ in candidates],
                "val_scores": [round(float(s), 4) for s in scores],
                "top_k": [candidates[i][0] for i in chosen],
                "weights": [round(float(w), 4) for w in weights],
            }
            members = [candidates[i][1] for i in chosen]
            if c.distill:
                current, seconds[f"distil round {e + 1}"] = self._distil(
                    ctx, members, weights, current, e
                )
            else:
                teacher = Ensemble(members, weights, rule="logits")
            rounds.append(entry)
        info = {"rounds": rounds, "senders": sorted(payloads), "timings": seconds}
        if c.distill and current is not local:
            held = held_out(ctx)
            pair = [predict_logits(m, held.x, ctx.device) for m in (local, current)]
            info["own_agreement"] = round(prediction_agreement(*pair), 4)
        if dropped:
            info["dropped"] = dropped
        if teacher is not None:
            teacher.info = info
            return teacher
        return GlobalModel(current, info=info)

    def notes(self, diagnostics: Mapping[str, Any]) -> list[str]:
        own = own_model_receivers(diagnostics)
        if not own:
            return []
        who = "every client" if len(own) == len(diagnostics) else f"clients {own}"
        return [
            f"for {who} ({len(own)} of {len(diagnostics)}) the teacher put >= {OWN_MASS:.0%} of "
            f"its weight on the client's own model in every round, or the final model predicts "
            f"as the client's local model on >= {OWN_AGREEMENT:.0%} of its held-out data: their "
            "result is local training"
        ]

    def _ensemble(
        self, ctx: ClientContext, models: list[nn.Module]
    ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Stage 3: the top-K candidates (indices), their simplex weights, every score."""
        c = self.config
        held = held_out(ctx)
        val = torch.stack([predict_logits(m, held.x, ctx.device) for m in models])
        finite = torch.isfinite(val).flatten(1).all(1)
        scores = torch.where(finite, validation_scores(val, held.y), torch.tensor(-1.0))
        cosines = torch.nan_to_num(prediction_cosines(val, 0), nan=-1.0)
        chosen = [i for i in top_k(scores, cosines, 0) if bool(finite[i])]
        chosen = (chosen if c.top_k == 0 else chosen[: c.top_k]) or [0]  # own model at least
        if c.weights == "uniform" or len(chosen) == 1:
            return chosen, torch.full((len(chosen),), 1.0 / len(chosen)), scores
        if c.weight_split == "val":  # the held-out logits are the ones scored above
            fit, logits = held, val[chosen]
        else:
            fit = ctx.data
            logits = torch.stack([predict_logits(models[i], fit.x, ctx.device) for i in chosen])
        return chosen, ensemble_weights(logits, fit.y, c.weight_steps, c.weight_lr), scores

    def _distil(
        self,
        ctx: ClientContext,
        members: list[nn.Module],
        weights: torch.Tensor,
        current: nn.Module,
        round_index: int,
    ) -> tuple[nn.Module, float]:
        """Stage 4 (cached): the student θ^(e)+ from θ^(e)- and the weighted ensemble, and
        the seconds its distillation took when it was computed."""
        c = self.config
        parts = {
            "members": [_fingerprint(m) for m in members],
            "weights": [round(float(w), 8) for w in weights],
            "start": _fingerprint(current),
            "kd": [c.temperature, c.kd_lambda, c.kd_epochs],
            "train": ctx.train_config.as_dict(),
        }

        def make() -> Payload:
            start = time.perf_counter()
            logits = torch.stack([predict_logits(m, ctx.data.x, ctx.device) for m in members])
            teacher = weighted_logits(logits, weights)
            student = copy.deepcopy(current)
            gen = torch_generator(ctx.seed, "fol", "distil", ctx.client_id, round_index)
            regularised_distillation(
                student,
                ctx.data.x,
                teacher,
                temperature=c.temperature,
                lam=c.kd_lambda,
                cfg=self._epochs(ctx, c.kd_epochs),
                generator=gen,
                device=ctx.device,
            )
            seconds = {"distil_seconds": time.perf_counter() - start}
            return model_fields(student.cpu()).merged(Payload({}, seconds))

        stored = client_artefact(
            ctx, "fol_student", parts, make, f"FOL student round {round_index + 1}"
        )
        model = model_from_fields(stored, ctx.dims).to(ctx.device).eval()
        return model, float(stored.scalars["distil_seconds"])


def _prunable(model: nn.Module) -> bool:
    """Whether the model has channel groups (an untraceable one is used unpruned)."""
    try:
        return bool(channel_groups(model))
    except StructureError:
        return False
