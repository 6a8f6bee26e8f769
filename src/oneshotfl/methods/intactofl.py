"""IntactOFL: Zeng et al., "One-shot-but-not-degraded Federated Learning" (ACM MM 2024,
OpenReview C7gSh5Y2bI).

Every client trains its own model (any architecture) and sends it once. The server keeps the
models intact as frozen experts and trains only a light gating network G, so the final model is
the mixture of experts f_M(x) = Σ_k ρ_k(x; G)·f(x; w_k) (Eq. 7), evaluated as one model. The
gate never sees data: a generator turns noise and pseudo-labels into auxiliary samples, trained
alternately with the gate (Algorithm 1, run by :func:`oneshotfl.training.synthesis.synthesise`
with the MoE as the learner). The server is data-free: it is handed no public pool.

Two readings (``reading``), because the authors' code (``zenghui9977/IntactOFL``) trains
something other than the paper's equations:

* ``code`` (default; the code behind the paper's numbers): the generator loss is DENSE's —
  BN statistics of the experts (/K) + CE of the MoE on the pseudo-label + the masked
  adversarial KL (T = 3) between the MoE and the plain uniform logit ensemble; the generator
  is re-initialised every round, its noise optimised with it (Adam β₁ = 0.5), the lowest-loss
  batch joins the pool D_A, labels sorted, gradients clipped at 10. The gate is linear
  scores on the flattened input, averaged over all experts (ρ_k = g_k/K, no softmax), trained
  by one pass over D_A per round with SGD (momentum 0.9, weight decay 1e-4, cosine), each
  batch first perturbed by ODS from the ensemble (T = 4, ε = ``ods_eps`` = 8 in normalised
  units as the repository's IntactOFL path has it), on CE + 0.01·std(g) + 1·T²·KL_T=4(ensemble
  ‖ MoE). The same repository divides by 255 for Co-Boosting, as Co-Boosting's own code does,
  and the paper says the noise follows Co-Boosting, so ε = 8 may be a slip: a sign step of 8
  moves every normalised pixel by about three times the whole pixel range. It is kept as the
  default because it is what the code runs and it measured better: on a Fashion-MNIST probe
  (10 clients of cnn/mlp/resnet8/vgg, α = 0.5, seed 0) the MoE reached 73.65% with ε = 8 and
  58.07% with ``ods_eps=0.0314`` (8/255), against 72.02% for the logit ensemble it starts from
  (docs/benchmarks/data-free.md).
* ``paper``: Eq. 6's softmax gate; the generator loss of Eq. 10, σ(f_M(x̂))·CE(f_M(x̂), y),
  with σ the per-sample variance across experts of their softmax outputs, mean over classes,
  as a stop-gradient weight (a differentiable σ would let the generator lower its loss by
  producing *easy* samples, the opposite of "a preference for hard samples"); the noise
  augmentation once, when a batch joins D_A (Algorithm 1 line 8: ODS from the ensemble with
  Co-Boosting's 8/255 in pixel units); the gate loss of Eq. 13, CE + λ·CV²(importance) with
  λ = 1 (Eq. 12); the generator is kept across rounds.

The gate starts at the plain ensemble in both readings (``gate_init=ensemble``, a deviation
from both: the paper gives no initialisation and the code uses PyTorch's default): its weights
start at 0 and its biases at 1 (``linear``, so ρ_k = 1/K) or 0 (``softmax``: uniform), so the
MoE starts as the logit-averaging ensemble (``ensemble:combine=logits``) and the gate only has
to learn where to depart from it. With PyTorch's default (``gate_init=torch``) the initial
scores on Fashion-MNIST have mean ≈ 0.02 and std ≈ 0.55, so about half the experts start with
a negative weight on their own logits; on the probe above that gate ended at 0.65%.

What the gate mixes (``mixture``): Eq. 7 weights "the outputs of the experts" without saying
which; the code mixes logits (``logits``, default), so a uniform gate is the logit-averaging
ensemble. ``probabilities`` mixes their softmax outputs, so a uniform gate is the
probability-averaging ``ensemble``. The two part under strong label skew: at Dirichlet
α = 0.05 and 0.1 (10 clients of cnn/mlp/resnet8/vgg, seed 0) the logit ensemble scored 10.1%
and 35.4%, the probability ensemble 40.2% and 57.6% (docs/benchmarks/data-free.md).

Knobs beyond the readings: ``gate`` (``linear``, ``softmax``, ``noisy_topk`` with ``top_k`` K
and ``gate_noise`` σ added to the scores in training only; Fig. 5; ``linear`` with ``top_k``
keeps each sample's K largest scores and zeroes the rest, as the code) and ``gates`` K_g (MMoE:
the K_g gates' weights averaged); the Table 4 ablation switches ``augmentation`` and
``informativeness`` (``paper``: the σ weight; ``code``: the adversarial term); ``balance``,
``kd`` and ``ods_eps`` override a reading's weights. Budget (a deviation, for 2 CPU cores):
``rounds`` = 30 and ``generator_steps`` = 10 with a generator of width ``width`` = 16, where the
code runs 200 × 30 at width 64 (the appendix says T = 40, T_g = 20): set them for the authors'
schedule. Experts stay in eval mode and are never updated; a BN-free expert (LeNet ``cnn``,
``mlp``) contributes nothing to the BN term, which is 0 when no expert has BatchNorm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.encoders.cost import forward_flops, trainable_parameters
from oneshotfl.functional import (
    cv_squared,
    expert_variance,
    kl_to_student,
    masked_disagreement,
    weighted_member_sum,
)
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models
from oneshotfl.methods.common import DATA_FREE_LIMIT, SendsTrainedModel
from oneshotfl.models.generator import SIDE_MULTIPLE, ImageGenerator, input_statistics
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import derive_seed, seeded_torch, torch_generator
from oneshotfl.training.synthesis import (
    NoAugmentation,
    SynthesisBudget,
    SynthesisConfig,
    synthesise,
)
from oneshotfl.training.synthesis_terms import BatchNormStatistics, ods_perturbation

GateKind = Literal["auto", "linear", "softmax", "noisy_topk"]


@dataclass(frozen=True)
class IntactOFLConfig(SynthesisBudget):
    """IntactOFL hyper-parameters (see the module docs).

    Attributes:
        reading: ``code`` (the authors' code) or ``paper`` (the paper's equations).
        gate: ``auto`` (``linear`` for code, ``softmax`` for paper), ``linear``, ``softmax``
            or ``noisy_topk``.
        gates: K_g gates whose weights are averaged (MMoE for K_g > 1).
        top_k: experts kept per sample by ``noisy_topk`` (None = all).
        gate_noise: σ of ``noisy_topk``'s training noise.
        augmentation: the ODS noise augmentation (Table 4's "Aug").
        informativeness: the hardness term (Table 4's "Inf").
        bn: weight of the BN-statistics term (``code``).
        balance: weight of the balance term (None = 0.01 std for code, 1 CV² for paper).
        kd: weight of the KL to the ensemble in the gate loss (None = 1 code, 0 paper).
        ods_eps: ODS step in normalised units (None = 8 for code, as its IntactOFL path;
            8/255 of the pixel range, i.e. 8/255/σ, for paper).
        gate_init: ``ensemble`` (the gate starts as the uniform ensemble) or ``torch``
            (PyTorch's default initialisation, the authors').
        mixture: what the gate mixes: the experts' ``logits`` (the code) or their
            ``probabilities`` (Eq. 7's "outputs" read as softmax outputs).

    The sizes (``rounds`` T, ``generator_steps`` T_g, ``batch_size``, ``noise_dim``,
    ``width``, ``generator_lr``, ``learner_lr`` the gate's) are :class:`SynthesisBudget`'s.
    """

    reading: Literal["code", "paper"] = "code"
    gate: GateKind = "auto"
    gates: int = 1
    top_k: int | None = None
    gate_noise: float = 1.0
    augmentation: bool = True
    informativeness: bool = True
    bn: float = 1.0
    balance: float | None = None
    kd: float | None = None
    ods_eps: float | None = None
    gate_init: Literal["ensemble", "torch"] = "ensemble"
    mixture: Literal["logits", "probabilities"] = "logits"

    def validate(self) -> None:
        super().validate()
        require(self.gates >= 1, "gates", ">= 1", self.gates)
        require(self.top_k is None or self.top_k >= 1, "top_k", ">= 1 or None", self.top_k)
        require(self.gate_noise >= 0, "gate_noise", ">= 0", self.gate_noise)
        for name in ("bn", "balance", "kd", "ods_eps"):
            value = getattr(self, name)
            require(value is None or value >= 0, name, ">= 0 or None", value)

    @property
    def gate_kind(self) -> GateKind:
        if self.gate != "auto":
            return self.gate
        return "linear" if self.reading == "code" else "softmax"


class Gate(nn.Module):
    """K_g linear gates on the flattened input; ρ(x) = mean_j act(x·G_j) (Eq. 6 with
    ``softmax``; ``linear``: the code's raw scores / K; ``noisy_topk``: Shazeer et al.'s
    top-K softmax of scores plus N(0, σ²) noise in training, drawn from the gate's own
    seeded stream)."""

    def __init__(self, in_features: int, experts: int, cfg: IntactOFLConfig, seed: int) -> None:
        super().__init__()
        self.kind, self.experts = cfg.gate_kind, experts
        self.top_k, self.noise = min(cfg.top_k or experts, experts), cfg.gate_noise
        linears = [nn.Linear(in_features, experts) for _ in range(cfg.gates)]
        if cfg.gate_init == "ensemble":  # ρ_k = 1/K for every input at the start
            for linear in linears:
                if self.top_k < experts:  # tiny weights break the ties of a top-K choice
                    nn.init.normal_(linear.weight, std=1e-4)
                else:
                    nn.init.zeros_(linear.weight)
                nn.init.constant_(linear.bias, 1.0 if self.kind == "linear" else 0.0)
        self.linears = nn.ModuleList(linears)
        self.rng = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ρ [B, K], raw scores [K_g, B, K])``."""
        raw = torch.stack([g(x.flatten(1)) for g in self.linears])
        if self.kind == "linear":
            h = raw
            if self.top_k < self.experts:  # the code: keep the K largest scores, zero the rest
                kept = raw.topk(self.top_k, dim=-1).indices
                h = torch.zeros_like(raw).scatter(-1, kept, raw.gather(-1, kept))
            return (h / self.experts).mean(0), raw
        h = raw
        if self.kind == "noisy_topk" and self.training and self.noise > 0:
            h = h + self.noise * torch.randn(h.shape, generator=self.rng).to(h)
        if self.kind == "noisy_topk" and self.top_k < self.experts:
            kept = h.topk(self.top_k, dim=-1).indices
            h = torch.full_like(h, -torch.inf).scatter(-1, kept, h.gather(-1, kept))
        return h.softmax(-1).mean(0), raw


class MixtureOfExperts(nn.Module):
    """f_M(x) = Σ_k ρ_k(x)·f(x; w_k) (Eq. 7) over frozen experts that stay in eval mode, f
    the experts' logits (``mixture=logits``, the code) or their softmax
    (``probabilities``; the module then returns the log of the mixture, whose softmax is the
    mixture renormalised)."""

    def __init__(
        self,
        experts: list[nn.Module],
        gate: Gate,
        mixture: Literal["logits", "probabilities"] = "logits",
    ) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts).requires_grad_(False)
        self.gate, self.mixture = gate, mixture

    def train(self, mode: bool = True) -> MixtureOfExperts:
        super().train(mode)
        self.experts.eval()  # frozen: BatchNorm keeps its running statistics
        return self

    def expert_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert's logits, ``[K, B, C]``."""
        return torch.stack([e(x) for e in self.experts])

    def combine(self, logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if self.mixture == "logits":
            return weighted_member_sum(weights.T, logits)
        mixed = weighted_member_sum(weights.T, F.softmax(logits, dim=-1))
        return mixed.clamp_min(1e-12).log()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine(self.expert_logits(x), self.gate(x)[0])


@dataclass
class GateProblem(NoAugmentation):
    """IntactOFL's losses for :func:`synthesise` (the MoE is the learner)."""

    moe: MixtureOfExperts
    bn: BatchNormStatistics
    cfg: IntactOFLConfig
    classes: int
    ods_eps: float

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.cfg.noise_dim, generator=gen)
        y = torch.randint(self.classes, (n,), generator=gen)
        return z, (y.sort().values if self.cfg.reading == "code" else y)

    def ensemble(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe.expert_logits(x).mean(0)

    def generator_loss(self, x: torch.Tensor, y: torch.Tensor, learner: nn.Module) -> torch.Tensor:
        cfg = self.cfg
        self.bn.clear()
        logits = self.moe.expert_logits(x)
        out = self.moe.combine(logits, self.moe.gate(x)[0])
        ce = F.cross_entropy(out, y, reduction="none")
        if cfg.reading == "paper":  # Eq. 10, σ as a stop-gradient weight
            weight = expert_variance(logits).detach() if cfg.informativeness else 1.0
            return (weight * ce).mean()
        loss = ce.mean() + cfg.bn * self.bn.loss().to(ce) / len(self.moe.experts)
        if cfg.informativeness:  # the MoE teaches, the plain ensemble is the "student"
            loss = loss - masked_disagreement(logits.mean(0), out, 3.0).mean()
        return loss

    def augment(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if self.cfg.reading == "code" or not self.cfg.augmentation:
            return x
        with torch.enable_grad():
            return ods_perturbation(self.ensemble, x, self.ods_eps, 4.0, gen)

    def perturb(
        self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> torch.Tensor:
        if self.cfg.reading == "paper" or not self.cfg.augmentation:
            return x
        return ods_perturbation(self.ensemble, x, self.ods_eps, 4.0, gen)

    def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        cfg, code = self.cfg, self.cfg.reading == "code"
        with torch.no_grad():
            logits = self.moe.expert_logits(x)
        weights, raw = self.moe.gate(x)
        out = self.moe.combine(logits, weights)
        loss = F.cross_entropy(out, y)
        balance = cfg.balance if cfg.balance is not None else (0.01 if code else 1.0)
        if balance:
            term = raw.std() if code else cv_squared(weights.sum(0))  # Eq. 12
            loss = loss + balance * term
        kd = cfg.kd if cfg.kd is not None else (1.0 if code else 0.0)
        if kd:
            target = F.softmax(logits.mean(0) / 4.0, dim=-1)
            loss = loss + kd * 16.0 * kl_to_student(out, target, 4.0).mean()
        return loss


def synthesis_config(cfg: IntactOFLConfig) -> SynthesisConfig:
    """Algorithm 1's loop: the authors' (:meth:`SynthesisBudget.authors_loop`) for the code
    reading; the paper's keeps the generator and its Adam across rounds, the last batch, and
    plain SGD (momentum 0.9) for the gate's one pass over D_A per round."""
    loop = cfg.authors_loop()
    if cfg.reading == "code":
        return loop
    return dataclasses.replace(
        loop,
        generator_beta1=0.9,
        generator_reset=False,
        optimise_noise=False,
        keep="last",
        clip=None,
        learner_weight_decay=0.0,
        learner_cosine=False,
    )


@register_method("intactofl", "IntactOFL: frozen client experts, MoE gate on generated data")
class IntactOFL(SendsTrainedModel[IntactOFLConfig]):
    """IntactOFL (see the module docs)."""

    cost = (
        "clients: one local training each (O(N)); server: every gate and generator step runs "
        "all n frozen experts (O(n) a step) and so does every prediction (O(n·|test|))"
    )

    known_limits = (DATA_FREE_LIMIT,)

    Config = IntactOFLConfig
    requires = Requires(data_free=True, images=SIDE_MULTIPLE, image_multiple=SIDE_MULTIPLE)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, task = self.config, ctx.task
        experts = client_models(payloads, ctx.dims)
        shape = (task.in_channels, task.image_size, task.image_size)
        with seeded_torch(ctx.seed, "intactofl", "init"):
            noise_seed = derive_seed(ctx.seed, "intactofl", "gate noise")
            gate = Gate(shape[0] * shape[1] * shape[2], len(experts), cfg, noise_seed)
            generator = ImageGenerator(cfg.noise_dim, cfg.width, task)
        moe = MixtureOfExperts(experts, gate, cfg.mixture).to(ctx.device)
        std = sum(input_statistics(task).std) / task.in_channels
        default_eps = 8.0 if cfg.reading == "code" else 8 / 255 / std
        eps = cfg.ods_eps if cfg.ods_eps is not None else default_eps
        with BatchNormStatistics(experts) as bn:
            problem = GateProblem(moe, bn, cfg, task.num_classes, eps)
            stats = synthesise(
                generator,
                moe,
                problem,
                synthesis_config(cfg),
                torch_generator(ctx.seed, "intactofl"),
                ctx.device,
                ctx.tracker,
                "intactofl server",
            )
            bn_layers = bn.layers
        probe = torch.zeros(1, *shape, device=ctx.device)
        info = {
            "reading": cfg.reading,
            "gate": cfg.gate_kind,
            "experts": len(experts),
            "bn_layers": bn_layers,
            "parameters": sum(p.numel() for p in moe.parameters()),
            "gate_parameters": trainable_parameters(gate),
            "generator_parameters": trainable_parameters(generator),
            "trainable_server_parameters": trainable_parameters(gate)
            + trainable_parameters(generator),
            "flops_per_image": forward_flops(moe.eval(), probe),
            "pool_size": stats.pool_size,
            "generator_loss": stats.generator_loss,
            "gate_loss": stats.learner_loss,
            "timings": {"server_seconds": stats.seconds},  # measured: never compared
        }
        return GlobalModel(moe.eval(), info)
