"""FENS (Allouah, Dhasade, Guerraoui, Gupta, Kermarrec, Pinot, Pires and Sharma, "Revisiting
Ensembling in One-Shot Federated Learning", NeurIPS 2024; authors' code ``sacs-epfl/fens``)
— **not one-shot**: the client models travel once, then a small aggregator over their
outputs is trained by federated learning for ``rounds`` cheap rounds.

Round 0 (the one-shot part): client k holds out ``proxy_fraction`` (10%) of its shard as its
*proxy* set, trains the federation's recipe on the rest and sends the model.

Round 1: the server sends every client all K models (and the aggregator's initial weights);
client k runs each on its proxy set and keeps z = [z_1, …, z_K] (the models' logits
stacked member-major, width K·C) with the labels — held in its artefact store for the later
rounds, which send only the aggregator.

Rounds 1 … R: each client takes ``local_steps`` SGD steps (lr ``client_lr`` 1.0) of
cross-entropy on batches of ``batch`` (128) of its n_k pairs (z, y), a fresh shuffle of them
each epoch walked in order (:func:`epoch_batches`, as the authors' shuffled data loader), and
sends the change Δ_k with r_k = min(n_k, ``local_steps`` · ``batch``), the examples it used
(:func:`examples_seen`: n_k once the steps cover an epoch, as the authors' ``get_ratios``
weighs clients); the server averages Δ = Σ r_k Δ_k / Σ r_k and takes the authors' FedAdam
step (:func:`fedadam_step`, no bias correction):

    m ← β₁ m + (1 − β₁) Δ,   v ← β₂ v + (1 − β₂) Δ²,   θ ← θ + η m / (√v + ε)

with η = ``server_lr`` 1e-3, β₁ 0.9, β₂ 0.99, ε 1e-3. The aggregator is the authors'
``SmallNN`` (``aggregator=nn``: Linear(K·C → K·d) → ReLU → Linear(K·d → C), d = ``hidden``
2) or one weight per model and a bias per class (``linear``; it starts as the logit mean):
:class:`~oneshotfl.models.aggregator.StackedAggregator`. The outcome is the ensemble of the
frozen client models combined by the final aggregator.

Choices and deviations: ``proxy=train`` fits the aggregator on the clients' own training
data instead (the models are then the full-shard ones every other method uses, and each
client's own model is scored on the data it trained on; the Fashion-MNIST rows of
docs/benchmarks/merging.md compare the two); the authors quantise
the models to INT8 before sending and calibrate that on the *test* split — we send float32
and hold no test data on a client; they log the best test accuracy over the rounds — we
report the final round's and evaluate every ``eval_every`` rounds for the history only; the
authors' sample script trains 2 local epochs, ours the federation's budget.

Privacy: every client receives every other client's model, white-box (a one-shot method's
server alone sees them); each round's change is one SGD step on a batch of the client's
(stacked logits, label) pairs, a gradient the server can try to invert into those pairs.

Cost: every client downloads every model once (n·|θ|) and the aggregator, n²·C·d + n·d + n·C
+ C parameters for ``nn``, each round, both ways. A client that lost its round-1 logits (a
restarted process without a disk cache) cannot take part in later rounds and is named.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.data.types import LabelledData
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fens_wire import AggregatorFields, aggregator_arrays, aggregator_from
from oneshotfl.models.aggregator import StackedAggregator, stack_member_logits
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.model_set import ModelSet, model_set_fields, models_from_set
from oneshotfl.protocol.outcome import AGGREGATOR, Ensemble, Outcome
from oneshotfl.protocol.spec import ModelSpec, PayloadSpec, ScalarSpec, WireDims
from oneshotfl.seeding import numpy_rng, torch_generator
from oneshotfl.training import optim
from oneshotfl.training.loop import predict_logits
from oneshotfl.training.recipe import ClientRecipe
from oneshotfl.training.services import client_artefact, train_model

DIGEST = "models_digest"


@dataclass(frozen=True)
class FENSConfig(Params):
    """FENS hyper-parameters (names as in the module docs).

    Attributes:
        rounds: aggregator rounds R after the models' round.
        aggregator: ``nn`` (the authors' SmallNN) or ``linear``.
        hidden: hidden units per client model of the ``nn`` aggregator (d).
        proxy: ``split`` (a held-out share of each shard) or ``train`` (the shard itself).
        proxy_fraction: the held-out share with ``proxy=split``.
        local_steps: SGD steps per client and round.
        client_lr: their learning rate.
        batch: examples per step.
        server_lr: FedAdam's learning rate η.
        beta1: FedAdam's β₁.
        beta2: FedAdam's β₂.
        eps: FedAdam's ε.
        eval_every: rounds between two evaluations for the history (the last is evaluated).
    """

    rounds: int = 500
    aggregator: Literal["nn", "linear"] = "nn"
    hidden: int = 2
    proxy: Literal["split", "train"] = "split"
    proxy_fraction: float = 0.1
    local_steps: int = 1
    client_lr: float = 1.0
    batch: int = 128
    server_lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-3
    eval_every: int = 50

    def validate(self) -> None:
        require(1 <= self.rounds <= 100_000, "rounds", "in [1, 100000]", self.rounds)
        require(1 <= self.hidden <= 1024, "hidden", "in [1, 1024]", self.hidden)
        ok = 0 < self.proxy_fraction < 1
        require(ok, "proxy_fraction", "in (0, 1)", self.proxy_fraction)
        require(self.local_steps >= 1, "local_steps", ">= 1", self.local_steps)
        require(self.client_lr > 0, "client_lr", "> 0", self.client_lr)
        require(self.batch >= 1, "batch", ">= 1", self.batch)
        require(self.server_lr > 0, "server_lr", "> 0", self.server_lr)
        require(0 <= self.beta1 < 1, "beta1", "in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "beta2", "in [0, 1)", self.beta2)
        require(self.eps > 0, "eps", "> 0", self.eps)
        require(self.eval_every >= 1, "eval_every", ">= 1", self.eval_every)


class ServerAggregator(StackedAggregator):
    """The server's aggregator with FedAdam's moments (parameter name → (m, v)); the
    moments are server state, not part of the saved model."""

    moments: dict[str, tuple[torch.Tensor, torch.Tensor]]


def fedadam_step(
    agg: ServerAggregator, delta: Mapping[str, torch.Tensor], cfg: FENSConfig
) -> ServerAggregator:
    """The authors' FedAdam (no bias correction) on a copy of ``agg`` with the mean client
    change ``delta``: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², θ ← θ + η m/(√v + ε)."""
    new = ServerAggregator(agg.kind, agg.members, agg.classes, agg.hidden)
    new.load_state_dict(agg.state_dict())
    new.to(next(agg.parameters()).device)
    new.moments = {}
    with torch.no_grad():
        for name, param in new.named_parameters():
            m, v = agg.moments[name]
            d = delta[name].to(param.device)
            m = cfg.beta1 * m + (1 - cfg.beta1) * d
            v = cfg.beta2 * v + (1 - cfg.beta2) * d * d
            param.add_(cfg.server_lr * m / (v.sqrt() + cfg.eps))
            new.moments[name] = (m, v)
    return new


def mean_change(
    agg: StackedAggregator, payloads: Mapping[int, Payload], shares: Mapping[int, float]
) -> dict[str, torch.Tensor]:
    """Σ_k s_k Δ_k, the clients' changes (``delta.*``) weighted by their ``shares``."""
    mean = {n: torch.zeros_like(p).detach() for n, p in agg.named_parameters()}
    for cid, share in shares.items():
        for n, m in mean.items():
            m += share * torch.from_numpy(payloads[cid].arrays[f"delta.{n}"]).to(m.device)
    return mean


def examples_seen(n: int, steps: int, batch: int) -> int:
    """r = min(n, steps · batch): the distinct examples ``steps`` batches of ``batch`` take
    from n walked through in order — all n once the steps cover an epoch (the authors'
    weight: n_i from one epoch on, batch · steps below it)."""
    return min(n, steps * batch)


def epoch_batches(n: int, steps: int, batch: int, gen: torch.Generator) -> list[torch.Tensor]:
    """The indices of ``steps`` batches of ``batch`` from n examples: a fresh shuffle of all
    n each epoch, walked in order (an epoch's last batch holds what is left), as a shuffled
    data loader gives them."""
    batches: list[torch.Tensor] = []
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps if n else 0):
        if not len(order):
            order = torch.randperm(n, generator=gen)
        batches.append(order[:batch])
        order = order[batch:]
    return batches


def proxy_split(
    data: LabelledData, fraction: float, seed: int, client: int
) -> tuple[LabelledData, LabelledData]:
    """``(train, proxy)``: ``fraction`` of ``data`` (at least one example, when there are two
    or more) held out at random from the client's own stream, the rest to train on."""
    n = len(data)
    held = min(n - 1, max(1, round(fraction * n))) if n >= 2 else 0
    order = torch.from_numpy(numpy_rng(seed, "fens", "proxy", client).permutation(n))
    keep, out = order[held:].sort().values, order[:held].sort().values
    return data.subset(keep), data.subset(out)


def members_digest(fields: Payload) -> str:
    """A digest of the member models a broadcast carries (its ``members.*`` fields)."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(fields.arrays):
        if key.startswith("members."):
            digest.update(key.encode())
            digest.update(fields.arrays[key].tobytes())
    for key in sorted(fields.scalars):
        if key.startswith("members."):
            digest.update(f"{key}={fields.scalars[key]}".encode())
    return digest.hexdigest()


@register_method(
    "fens",
    "NOT one-shot: FENS — client models once, then R rounds of FL for an aggregator over them",
)
class FENS(Method[FENSConfig]):
    """Frozen client models plus a federated aggregator over their outputs (module docs)."""

    Config = FENSConfig
    requires = Requires(data_free=True)
    cost = (
        "clients: one local training, one pass of every client model over a 10% proxy split "
        "(O(n·N/10)), then R one-batch steps; download: every model once (n·|θ|) and the "
        "aggregator (O(n²·C·d) parameters) every round, both ways"
    )

    def num_rounds(self) -> int:
        return 1 + self.config.rounds

    def evaluates_round(self, round_index: int) -> bool:
        return round_index % self.config.eval_every == 0

    def _fields(self, prefix: str) -> AggregatorFields:
        return AggregatorFields(prefix, self.config.aggregator, self.config.hidden)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(models=(ModelSpec(),))

    def round_payload_spec(self, dims: WireDims, round_index: int) -> PayloadSpec:
        if round_index == 0:
            return self.payload_spec(dims)
        seen = ScalarSpec("n_seen", int, 0, "N_max")
        return PayloadSpec(scalars=(seen,), groups=(self._fields("delta"),))

    def broadcast_spec(self, dims: WireDims, round_index: int) -> PayloadSpec | None:
        if round_index == 0:
            return None
        models = (ModelSet(),) if round_index == 1 else ()
        digest = ScalarSpec(DIGEST, str)
        return PayloadSpec(scalars=(digest,), groups=(self._fields("aggregator"), *models))

    # -- the client -----------------------------------------------------------------------

    def _split(self, ctx: ClientContext) -> tuple[LabelledData, LabelledData]:
        if self.config.proxy == "train":
            return ctx.data, ctx.data
        return proxy_split(ctx.data, self.config.proxy_fraction, ctx.seed, ctx.client_id)

    def local_model(self, ctx: ClientContext) -> nn.Module | None:
        train, _ = self._split(ctx)
        own = ctx if self.config.proxy == "train" else dataclasses.replace(ctx, data=train)
        return train_model(own, ctx.recipe())

    def client_recipe(self, ctx: ClientContext) -> ClientRecipe | None:
        return ctx.recipe() if self.config.proxy == "train" else None

    def _proxy_logits(self, ctx: ClientContext, broadcast: Payload) -> Payload:
        """The client's stacked proxy logits z and labels y for the broadcast's models: made
        in round 1, then read from the client's store."""
        digest = str(broadcast.scalars[DIGEST])

        def make() -> Payload:
            if ctx.round != 1:
                raise RuntimeError(
                    f"fens: client {ctx.client_id} has not got the round-1 models "
                    f"({digest[:12]}) in its store in round {ctx.round}: a process restarted "
                    "without a disk cache (cache_dir) cannot rejoin"
                )
            if members_digest(broadcast) != digest:
                raise ValueError("fens: the broadcast's models do not match its digest")
            models = models_from_set(broadcast, ctx.dims)
            _, proxy = self._split(ctx)
            logits = torch.stack([predict_logits(m, proxy.x, ctx.device) for m in models.values()])
            z = stack_member_logits(logits).float().numpy()
            return Payload({"z": z, "y": proxy.y.numpy().astype("int64")}, {})

        parts = {
            "models": digest,
            "proxy": self.config.proxy,
            "fraction": self.config.proxy_fraction,
        }
        return client_artefact(ctx, "fens_proxy_logits", parts, make, "FENS proxy logits")

    def client_update(self, ctx: ClientContext) -> Payload:
        if ctx.round == 0:
            model = self.local_model(ctx)
            assert model is not None
            return model_fields(model.cpu())
        if ctx.broadcast is None:
            raise ValueError(f"fens: client {ctx.client_id} got no aggregator in round {ctx.round}")
        cfg, classes = self.config, ctx.task.num_classes
        proxy = self._proxy_logits(ctx, ctx.broadcast)
        z = torch.from_numpy(proxy.arrays["z"]).to(ctx.device)
        y = torch.from_numpy(proxy.arrays["y"]).to(ctx.device)
        k = z.shape[1] // classes
        agg = aggregator_from(ctx.broadcast, "aggregator", cfg.aggregator, k, classes, cfg.hidden)
        agg = agg.to(ctx.device).train()
        start = {n: p.detach().clone() for n, p in agg.named_parameters()}
        gen = torch_generator(ctx.seed, "client", ctx.client_id, "fens", ctx.round)
        opt = optim.SGD(agg.parameters(), lr=cfg.client_lr)
        steps = cfg.local_steps if len(y) else 0
        for pick in epoch_batches(len(y), steps, cfg.batch, gen):
            pick = pick.to(ctx.device)
            opt.zero_grad()
            F.cross_entropy(agg(z[pick]), y[pick]).backward()
            opt.step()
        delta = {n: p.detach() - start[n] for n, p in agg.named_parameters()}
        seen = examples_seen(len(y), steps, cfg.batch)
        return Payload(aggregator_arrays(delta, "delta"), {"n_seen": seen})

    # -- the server -----------------------------------------------------------------------

    def server_message(
        self, round_index: int, previous: Outcome | None, ctx: ServerContext
    ) -> Payload | None:
        if round_index == 0:
            return None
        if not isinstance(previous, Ensemble) or previous.aggregator is None:
            raise TypeError(f"fens: expected the previous round's ensemble, got {previous!r}")
        ids = [int(i) for i in previous.info["members"]]
        members = model_set_fields(dict(zip(ids, previous.members, strict=True)))
        weights = aggregator_arrays(dict(previous.aggregator.named_parameters()), "aggregator")
        out = Payload(weights, {DIGEST: str(previous.info[DIGEST])})
        return out.merged(members) if round_index == 1 else out

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.round == 0:
            return self._start(payloads, ctx)
        previous = ctx.previous
        if not isinstance(previous, Ensemble) or not isinstance(
            previous.aggregator, ServerAggregator
        ):
            raise TypeError(
                f"{self.name}: expected the previous round's ensemble, got {previous!r}"
            )
        agg = previous.aggregator
        first = next(n for n, _ in agg.named_parameters())
        mismatched: list[int] = []
        seen: dict[int, float] = {}
        for cid, payload in payloads.items():
            if payload.arrays[f"delta.{first}"].shape != tuple(agg.get_parameter(first).shape):
                mismatched.append(cid)  # sized for another K: not this round's aggregator
                continue
            seen[cid] = float(payload.scalars["n_seen"])
        total = sum(seen.values())
        shares = {cid: r / total for cid, r in seen.items()} if total > 0 else {}
        mean = mean_change(agg, payloads, shares)
        new = self.server_step(agg, mean, payloads, shares, ctx) if shares else agg
        with torch.no_grad():
            norm = float(torch.stack([d.pow(2).sum() for d in mean.values()]).sum().sqrt())
        info = {**previous.info, "round": ctx.round, "update_norm": norm}
        if mismatched:
            info["mismatched_updates"] = mismatched
        return Ensemble(list(previous.members), rule=AGGREGATOR, info=info, aggregator=new)

    def server_step(
        self,
        agg: ServerAggregator,
        mean: Mapping[str, torch.Tensor],
        payloads: Mapping[int, Payload],
        shares: Mapping[int, float],
        ctx: ServerContext,
    ) -> ServerAggregator:
        """The aggregator after one round from the clients' ``mean`` change Σ_k s_k Δ_k
        (``shares`` s_k = r_k / Σ r over the clients whose change fits it): the authors'
        FedAdam, :func:`fedadam_step`."""
        return fedadam_step(agg, mean, self.config)

    def _start(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Ensemble:
        """Round 0: the clients' models, and the aggregator's initialisation over them."""
        ids = sorted(payloads)
        members = [model_from_fields(payloads[c], ctx.dims).to(ctx.device).eval() for c in ids]
        cfg, classes = self.config, ctx.task.num_classes
        gen = torch_generator(ctx.seed, "server", "fens", "aggregator")
        agg = ServerAggregator(cfg.aggregator, len(ids), classes, cfg.hidden, gen).to(ctx.device)
        agg.moments = {
            n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in agg.named_parameters()
        }
        digest = members_digest(model_set_fields(dict(zip(ids, members, strict=True))))
        parameters = sum(p.numel() for p in agg.parameters())
        info = {"members": ids, DIGEST: digest, "aggregator_parameters": parameters, "round": 0}
        return Ensemble(members, rule=AGGREGATOR, info=info, aggregator=agg)
