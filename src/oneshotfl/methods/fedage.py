"""FedAGE: "One-shot federated aggregation of generalized embeddings for edge environments"
(the paper in ``shared/papers/fedage--001``), Algorithms 1 and 2, Section 3.

Every party holds the same frozen encoder E (``encoder`` in the experiment config; its
fingerprint is checked). **Client** i (Algorithm 2) embeds its data once, z = E(x) (cached),
trains a light fully connected head C_i on (z, y) with cross-entropy, and uploads its latents
Z_i and C_i — never its labels. The latents are per-sample data: they are counted in the
upload bytes like everything else.

**Server** (Algorithm 1) trains its own head C_s on the latents only:

* Phase 1, sequentially over clients i = 1 … n: teacher P_i = softmax(C_i(z)/τ), pseudo-label
  ŷ = argmax P_i, confidence w_z = max P_i(z); L_hard = CE(ŷ, C_s(z)) (Eq. 2); the soft target
  is P_i for the first client and the knowledge mix P_mixed = γ·P_i + (1−γ)·P_s^(i−1) after
  (Eq. 5); L_soft = mean_z w_z·KL(target ‖ softmax(C_s(z)/τ)) (Eqs. 3, 6);
  L_KD = β·L_hard + (1−β)·L_soft (Eq. 1).
* Phase 2: ensemble distillation on all latents, KL(P_ens ‖ softmax(C_s(z)/τ)) with
  P_ens = (1/n)·Σ_i P_i (Eq. 4).

The global model is E followed by C_s, evaluated on the real test images.

Choices where the paper leaves room (``FedAGEConfig`` fields):

* ``previous``: P_s^(i−1) is a frozen ``snapshot`` of the server head after client i−1
  (the paper's superscript; default) or the ``live`` head being trained (detached).
* ``order``: clients in id order (default), by ``size`` (largest first) or ``random`` (seeded).
* ``ensemble_weighting``: Eq. (4) and Algorithm 1 have no confidence weight in phase 2
  (``none``, default); the text says the weighting "is applied in both", so ``confidence``
  weights phase 2 by max P_ens(z).
* ``schedule``: Algorithm 1 loops "for each client (sequentially)" and Section 3.3.1 says the
  classifier "is trained over multiple rounds sequentially across all clients". The default
  ``sequential`` reads this as blocks (every epoch on client 1, then on client 2, …);
  ``interleaved`` as cycles (each epoch visits every client once, in order).
* ``ensemble_epochs``: epochs of phase 2 (default: ``epochs``, as every phase in Table 5);
  0 skips phase 2 — an ablation: under strong label skew the uniform teacher mean of Eq. (4)
  is dominated by heads that never saw a sample's class, and phase 2, run last, pulls the
  student towards it (see docs/benchmarks.md).
* Optimiser: Adam for heads and server (the paper's), learning rate ``lr`` (Fashion-MNIST:
  1e-3 in Table 5), ``epochs`` per client head and per server phase step (7 in Table 5),
  batch size of the client training config. γ defaults to Table 5's Fashion-MNIST 0.75,
  β to 0.5, τ to 2.
* Heads: ``head`` (comma list cycling over client ids, for heterogeneous heads) and
  ``server_head``, from the model registry (``head_mlp`` = d → 128 → C is Classifier 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.encoders.base import EncodedClassifier, Encoder
from oneshotfl.functional import kl_rows, kl_to_student
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import (
    client_embeddings,
    encoded_head,
    head_from_payload,
    head_train_config,
    trained_client_head,
)
from oneshotfl.models import MODELS, create_model
from oneshotfl.params import Params, require
from oneshotfl.privacy import analytic_gaussian_sigma, gaussian_release
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.payload import Payload
from oneshotfl.protocol.spec import (
    ArraySpec,
    ModelSpec,
    PayloadSpec,
    ScalarSpec,
    WireDims,
    model_fields,
)
from oneshotfl.seeding import numpy_rng, seeded_torch, torch_generator
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import Batch, TrainConfig, fit


@dataclass(frozen=True)
class FedAGEConfig(Params):
    """FedAGE hyper-parameters (Table 5's Fashion-MNIST values where it gives them).

    Attributes:
        head: client head architecture(s), comma-separated to cycle over client ids.
        server_head: the server head architecture.
        epochs: epochs of client head training, of each phase-1 step and of phase 2.
        ensemble_epochs: epochs of phase 2 when set (0 skips it; None = ``epochs``).
        schedule: phase 1 as ``sequential`` blocks (all epochs on client 1, then client 2…)
            or ``interleaved`` cycles (each epoch visits every client in order).
        lr: Adam learning rate of heads and server.
        tau: softmax temperature τ of teacher and student.
        beta: β, weight of the hard loss in Eq. (1).
        gamma: γ, weight of the current teacher in the knowledge mix (Eq. 5).
        previous: P_s^(i−1) from a frozen ``snapshot`` or the ``live`` server head.
        order: client order of phase 1: ``id``, ``size`` (largest first) or ``random``.
        ensemble_weighting: phase-2 confidence weight, ``none`` (Eq. 4) or ``confidence``.
        dp_epsilon: local DP on the uploaded latents: clip each to L2 ≤ ``clip`` and add
            analytic-Gaussian noise for (ε, ``dp_delta``) per record (None = no DP).
        dp_delta: δ of the latents' guarantee.
        clip: the L2 bound C (sensitivity 2C under replace-one adjacency).
        head_source: with DP, train the head on the ``noised`` latents (default) or the
            ``clean`` ones; either way the head also sees the clean labels, so it is not
            covered by the guarantee (see the privacy report).
    """

    head: str = "head_mlp"
    server_head: str = "head_mlp"
    epochs: int = 7
    ensemble_epochs: int | None = None
    schedule: Literal["sequential", "interleaved"] = "sequential"
    lr: float = 1e-3
    tau: float = 2.0
    beta: float = 0.5
    gamma: float = 0.75
    previous: Literal["snapshot", "live"] = "snapshot"
    order: Literal["id", "size", "random"] = "id"
    ensemble_weighting: Literal["none", "confidence"] = "none"
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    clip: float = 1.0
    head_source: Literal["noised", "clean"] = "noised"

    def validate(self) -> None:
        heads = [h.strip() for h in self.head.split(",")]
        for name in [*heads, self.server_head]:
            require(name in MODELS, "head", "registered models", name)
        require(self.epochs >= 1, "epochs", ">= 1", self.epochs)
        epochs = self.ensemble_epochs
        require(epochs is None or epochs >= 0, "ensemble_epochs", ">= 0 or None", epochs)
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(self.tau > 0, "tau", "> 0", self.tau)
        require(0 <= self.beta <= 1, "beta", "in [0, 1]", self.beta)
        require(0 <= self.gamma <= 1, "gamma", "in [0, 1]", self.gamma)
        eps = self.dp_epsilon
        require(eps is None or eps > 0, "dp_epsilon", "> 0 or None", eps)
        require(0 < self.dp_delta < 1, "dp_delta", "in (0, 1)", self.dp_delta)
        require(self.clip > 0, "clip", "> 0", self.clip)

    def privacy_report(self) -> dict[str, Any]:
        """Every uploaded field: covered by the (ε, δ) guarantee or not, and why."""
        if self.dp_epsilon is None:
            none = {"covered": False, "why": "no DP configured (dp_epsilon unset)"}
            return {"latents": none, "head": none, "n_examples": none}
        sigma = analytic_gaussian_sigma(self.dp_epsilon, self.dp_delta, 2 * self.clip)
        if self.head_source == "noised":
            source = "the noised latents (post-processing)"
        else:
            source = "the clean latents"
        return {
            "latents": {
                "covered": True,
                "epsilon": self.dp_epsilon,
                "delta": self.dp_delta,
                "mechanism": "analytic Gaussian (Balle & Wang 2018), per record",
                "clip_l2": self.clip,
                "sensitivity_l2": 2 * self.clip,
                "adjacency": "replace one record",
                "sigma": sigma,
            },
            "head": {
                "covered": False,
                "why": f"trained on {source} and the clean labels; labels are not privatised",
            },
            "n_examples": {"covered": False, "why": "the exact example count"},
        }

    def client_head(self, client_id: int) -> str:
        heads = [h.strip() for h in self.head.split(",")]
        return heads[client_id % len(heads)]


def kd_loss(
    student_logits: torch.Tensor,
    hard: torch.Tensor,
    soft: torch.Tensor,
    weight: torch.Tensor,
    beta: float,
    tau: float,
) -> torch.Tensor:
    """Eq. (1): β·CE(ŷ, C_s(z)) + (1−β)·mean_z w_z·KL(soft ‖ softmax(C_s(z)/τ))."""
    ce = F.cross_entropy(student_logits, hard)
    kl = kl_rows(soft, F.log_softmax(student_logits / tau, dim=-1))
    return beta * ce + (1 - beta) * (weight * kl).mean()


@register_method("fedage", "FedAGE: frozen encoder, latents + head upload, progressive KD")
class FedAGE(Method[FedAGEConfig]):
    """FedAGE: clients send embeddings and a head; the server distils progressively."""

    Config = FedAGEConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        d = dims.extra.get("D")
        if d is None:
            raise ValueError("fedage: the wire dims carry no embedding size D (no encoder)")
        return PayloadSpec(
            arrays=(ArraySpec("latents", ("N", "D")),),
            models=(ModelSpec("head", input_dims=(d, 1)),),
            scalars=(ScalarSpec("n_examples", int, 1),),
        )

    def _client(self, ctx: ClientContext) -> tuple[nn.Module, torch.Tensor]:
        """Algorithm 2 with the optional local DP: the head and the latents to upload."""
        cfg = self.config
        released = None
        if cfg.dp_epsilon is not None:
            generator = torch_generator(ctx.seed, "fedage", "dp", ctx.client_id)
            released, _ = gaussian_release(
                client_embeddings(ctx), cfg.clip, cfg.dp_epsilon, cfg.dp_delta, generator
            )
        train_on = released if cfg.head_source == "noised" else None
        arch = cfg.client_head(ctx.client_id)
        head, z = trained_client_head(ctx, arch, cfg.epochs, cfg.lr, latents=train_on)
        return head, z if released is None else released

    def client_update(self, ctx: ClientContext) -> Payload:
        head, upload = self._client(ctx)
        return Payload({"latents": upload.numpy()}, {"n_examples": len(upload)}).merged(
            model_fields(head.cpu(), "head")
        )

    def local_model(self, ctx: ClientContext) -> nn.Module:
        """The client's head on the shared encoder, E followed by C_i."""
        return encoded_head(ctx, self._client(ctx)[0])

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        encoder: Encoder | None = ctx.encoder
        if encoder is None:
            raise ValueError("fedage needs the shared frozen encoder: set encoder")
        cfg, ids = self.config, sorted(payloads)
        latents = {c: torch.from_numpy(np.asarray(payloads[c].arrays["latents"])) for c in ids}
        heads = {c: head_from_payload(payloads[c], ctx.dims) for c in ids}
        with seeded_torch(ctx.seed, "fedage", "server"):
            student = create_model(cfg.server_head, encoder.dim, ctx.task.num_classes, 1)
        train = head_train_config(cfg.epochs, cfg.lr, ctx.train_config.batch_size)
        order = self._order(ids, latents, ctx.seed)
        teachers = {c: self._probs(heads[c], latents[c]) for c in ids}  # P_i on Z_i
        cycles, step_train = 1, train
        if cfg.schedule == "interleaved":  # every epoch visits the clients in order
            cycles, step_train = train.epochs, replace(train, epochs=1)
        step = 0
        for _ in range(cycles):  # phase 1: sequential, confidence-weighted KD
            for c in order:
                p_i = teachers[c]
                soft, mix_live = p_i, False
                if step > 0 and cfg.previous == "snapshot":  # P_s^(i−1): the head before i
                    soft = cfg.gamma * p_i + (1 - cfg.gamma) * self._probs(student, latents[c])
                elif step > 0:
                    mix_live = True  # Eq. (5) against the head being trained, per batch
                self._fit_kd(student, latents[c], p_i, soft, mix_live, step_train, ctx, step)
                step += 1
        all_z = torch.cat([latents[c] for c in ids])
        p_ens = torch.stack([self._probs(heads[c], all_z) for c in ids]).mean(dim=0)  # Eq. (4)
        weight = (
            p_ens.max(dim=-1).values
            if cfg.ensemble_weighting == "confidence"
            else torch.ones(len(all_z))
        )
        tau = cfg.tau
        phase2 = (
            train if cfg.ensemble_epochs is None else replace(train, epochs=cfg.ensemble_epochs)
        )
        distil(  # Eq. (4): mean_z w_z·KL(P_ens ‖ softmax(C_s(z)/τ)) (w_z = 1 by default)
            student,
            all_z,
            lambda logits, target: kl_to_student(logits, target, tau),
            phase2,
            torch_generator(ctx.seed, "fedage", "ensemble"),
            ctx.device,
            targets=(p_ens,),
            weights=weight,
            tracker=ctx.tracker,
            description="fedage server phase 2 (ensemble)",
        )
        info: dict[str, Any] = {
            "order": order,
            "latents": len(all_z),
            "privacy": cfg.privacy_report(),
        }
        return GlobalModel(EncodedClassifier(encoder, student.cpu().eval()).eval(), info)

    def _probs(self, head: nn.Module, z: torch.Tensor) -> torch.Tensor:
        """softmax(head(z)/τ) on the CPU, without gradients."""
        head = head.cpu().eval()
        with torch.no_grad():
            return torch.softmax(head(z) / self.config.tau, dim=-1)

    def _order(self, ids: list[int], latents: Mapping[int, torch.Tensor], seed: int) -> list[int]:
        if self.config.order == "size":
            return sorted(ids, key=lambda c: (-len(latents[c]), c))
        if self.config.order == "random":
            return [int(c) for c in numpy_rng(seed, "fedage", "order").permutation(ids)]
        return list(ids)

    def _fit_kd(
        self,
        student: nn.Module,
        z: torch.Tensor,
        p_i: torch.Tensor,
        soft: torch.Tensor,
        mix_live: bool,
        train: TrainConfig,
        ctx: ServerContext,
        step: int,
    ) -> None:
        hard, weight = p_i.argmax(dim=-1), p_i.max(dim=-1).values
        beta, tau, gamma = self.config.beta, self.config.tau, self.config.gamma

        def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
            zb, h, s, w = batch
            logits = model(zb)
            if mix_live:
                s = gamma * s + (1 - gamma) * torch.softmax(logits.detach() / tau, dim=-1)
            return kd_loss(logits, h, s, w, beta, tau)

        fit(
            student,
            (z, hard, soft, weight),
            loss_fn,
            train,
            torch_generator(ctx.seed, "fedage", "phase1", step),
            ctx.device,
            ctx.tracker,
            f"fedage server phase 1 ({step + 1})",
        )
