"""Data-free ensemble distillation with a generator: DENSE (Zhang et al., NeurIPS 2022, "DENSE:
Data-Free One-Shot Federated Learning") and Co-Boosting (Dai et al., ICLR 2024, "Enhancing
One-Shot Federated Learning Through Data and Ensemble Co-Boosting"), as IntactOFL's Table 1
runs them (its repository ``zenghui9977/IntactOFL`` holds the code of both baselines).

Clients send their trained models; the server, handed no data (``Requires(data_free=True)``),
trains a generator against the ensemble of the client models and distils the ensemble into a
student on the generated samples, alternately
(:meth:`~oneshotfl.training.synthesis.SynthesisBudget.authors_loop`: the generator reset every
round with its noise optimised, the lowest-loss batch into an accumulating pool, one SGD pass of
the student over the pool per round). The student is ``server_model`` when set, else the
architecture of the lowest-id client, from its shared initialisation.

* ``dense`` — the teacher is the uniform logit ensemble T(x) = (1/K)Σ_k z_k(x). Generator loss:
  ``bn``·Σ BN-statistics / K + CE(T(x̂), y) − ``adversarial``·mean(mask·T_a²·KL_T_a(T ‖ S)),
  T_a = 3, where the mask keeps the samples on which teacher and student disagree (argmax)
  — the generated data stays where the student is still wrong. Labels sorted as the code
  draws them. Student loss: T²·KL_T(T ‖ S), T = ``temperature`` = 4. The original DENSE code
  also augments the batch (crop + flip) before the teacher and divides nothing by K; we follow
  the IntactOFL repository, whose numbers are the comparison.
* ``co_boosting`` — hard samples: the CE term of each sample weighted by (1 − p_y)^``hardness``
  with p the teacher's detached softmax, and the adversarial KL unmasked; every student batch
  is first perturbed by ODS from the teacher (T = 4, ε = ``ods_eps`` = 8/255 in normalised
  units as the code has it). ``ensemble_weights=fixed`` (default: IntactOFL's baseline keeps
  the ensemble uniform) or ``boosted`` (the original Co-Boosting): after every round the
  ensemble weights take ``weight_passes`` passes of signed-gradient steps on the pool's CE,
  step μ·0.99^round (μ = ``weight_step``), clamped to [0, 1]; the teacher is then
  Σ_k w_k z_k / Σ_k w_k.

Budget: ``rounds`` = 30, ``generator_steps`` = 10 and a generator of width 16 (the code runs
200 × 30 at width 64), for 2 CPU cores. A teacher without BatchNorm (LeNet ``cnn``, ``mlp``)
adds nothing to the BN term.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.functional import kl_to_student, masked_disagreement, weighted_member_sum
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_models, shared_initial_model
from oneshotfl.methods.common import DATA_FREE_LIMIT, SendsTrainedModel
from oneshotfl.models.generator import SIDE_MULTIPLE, ImageGenerator
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.synthesis import (
    NoAugmentation,
    SynthesisBudget,
    SynthesisConfig,
    synthesise,
)
from oneshotfl.training.synthesis_terms import BatchNormStatistics, ods_perturbation


@dataclass(frozen=True)
class DenseConfig(SynthesisBudget):
    """DENSE's weights (the sizes are :class:`SynthesisBudget`'s; see the module docs).

    Attributes:
        bn: weight of the term that pulls a generated batch's BatchNorm statistics towards
            the teachers' running statistics (0: off).
        adversarial: weight of the adversarial term, which rewards generated inputs on which
            teacher and student disagree (0: off).
        temperature: distillation temperature T of the student's loss.
    """

    bn: float = 1.0
    adversarial: float = 1.0
    temperature: float = 4.0

    def validate(self) -> None:
        super().validate()
        for name in ("bn", "adversarial"):
            require(getattr(self, name) >= 0, name, ">= 0", getattr(self, name))
        require(self.temperature > 0, "temperature", "> 0", self.temperature)


@dataclass(frozen=True)
class CoBoostingConfig(DenseConfig):
    """Co-Boosting's knobs on top of DENSE's.

    Attributes:
        hardness: exponent of the (1 − p_y) weight that favours hard generated samples in
            the generator's CE (0: plain CE).
        ods_eps: size of the ODS perturbation of every student batch, in normalised units
            (0: none).
        ensemble_weights: the teachers' weights: ``fixed`` (uniform) or ``boosted`` (learnt
            on the generated pool after every round).
        weight_passes: passes over the pool per round of the ensemble-weight update.
        weight_step: μ, the step of the ensemble-weight update (times 0.99 per round).
    """

    hardness: float = 1.0
    ods_eps: float = 8 / 255
    ensemble_weights: Literal["fixed", "boosted"] = "fixed"
    weight_passes: int = 1
    weight_step: float = 0.01

    def validate(self) -> None:
        super().validate()
        for name in ("hardness", "ods_eps", "weight_step"):
            require(getattr(self, name) >= 0, name, ">= 0", getattr(self, name))
        require(self.weight_passes >= 1, "weight_passes", ">= 1", self.weight_passes)


@dataclass
class DistilFromEnsemble(NoAugmentation):
    """DENSE's losses; :class:`HardSamples` changes them into Co-Boosting's."""

    teachers: list[nn.Module]
    bn: BatchNormStatistics
    cfg: Any  # the method's config (DENSE's fields here; a subclass reads its own)
    classes: int
    weights: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.weights = torch.full((len(self.teachers),), 1.0 / len(self.teachers))

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.cfg.noise_dim, generator=gen)
        return z, torch.randint(self.classes, (n,), generator=gen).sort().values

    def teacher(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """Σ_k w_k z_k(x) / Σ_k w_k."""
        w = (self.weights if weights is None else weights).to(x)
        logits = torch.stack([t(x) for t in self.teachers])
        return weighted_member_sum(w, logits) / w.sum()

    def similarity(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(t, y)

    def disagreement(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return masked_disagreement(s, t, 3.0).mean()

    def generator_loss(self, x: torch.Tensor, y: torch.Tensor, learner: nn.Module) -> torch.Tensor:
        cfg = self.cfg
        self.bn.clear()
        t = self.teacher(x)
        loss = self.similarity(t, y) + cfg.bn * self.bn.loss().to(t) / len(self.teachers)
        if cfg.adversarial:
            loss = loss - cfg.adversarial * self.disagreement(learner(x), t)
        return loss

    def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        temperature = self.cfg.temperature
        with torch.no_grad():
            target = F.softmax(self.teacher(x) / temperature, dim=-1)
        return temperature**2 * kl_to_student(learner(x), target, temperature).mean()


@dataclass
class HardSamples(DistilFromEnsemble):
    """Co-Boosting: hardness-weighted CE, unmasked disagreement, ODS, boosted weights."""

    rounds_seen: int = 0

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.cfg.noise_dim, generator=gen)
        return z, torch.randint(self.classes, (n,), generator=gen)

    def similarity(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert isinstance(self.cfg, CoBoostingConfig)
        p_y = F.softmax(t, -1).gather(1, y[:, None]).squeeze(1).detach()
        return ((1 - p_y) ** self.cfg.hardness * F.cross_entropy(t, y, reduction="none")).mean()

    def disagreement(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return 9.0 * kl_to_student(s, F.softmax(t / 3.0, -1), 3.0).mean()

    def perturb(
        self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> torch.Tensor:
        assert isinstance(self.cfg, CoBoostingConfig)
        if not self.cfg.ods_eps:
            return x
        return ods_perturbation(self.teacher, x, self.cfg.ods_eps, 4.0, gen)

    def pool_grew(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> None:
        cfg = self.cfg
        assert isinstance(cfg, CoBoostingConfig)
        if cfg.ensemble_weights == "fixed":
            return
        step = cfg.weight_step * 0.99**self.rounds_seen
        self.rounds_seen += 1
        w = self.weights.clone()
        with torch.enable_grad():
            for _ in range(cfg.weight_passes):
                for idx in torch.randperm(len(x), generator=gen).split(cfg.batch_size):
                    idx = idx.to(x.device)
                    w.requires_grad_(True)
                    loss = F.cross_entropy(self.teacher(x[idx], w), y[idx])
                    (grad,) = torch.autograd.grad(loss, w)
                    w = (w.detach() - step * grad.sign().cpu()).clamp(0, 1)
        if float(w.sum()) > 0:  # all-zero weights would leave no teacher: keep the last ones
            self.weights = w.detach()


class DataFreeDistillation(SendsTrainedModel[Any]):
    """The server half DENSE and Co-Boosting share (see the module docs)."""

    cost = (
        "clients: one local training each (O(N)); server: every synthesis and distillation step"
        " runs the n-teacher ensemble (O(n) a step); evaluation: one model"
    )

    known_limits = (DATA_FREE_LIMIT,)

    requires = Requires(data_free=True, images=SIDE_MULTIPLE, image_multiple=SIDE_MULTIPLE)
    problem: type[DistilFromEnsemble] = DistilFromEnsemble

    def generator(self, ctx: ServerContext) -> nn.Module:
        """The generator, from the model seed's stream for this method."""
        with seeded_torch(ctx.seed, self.name, "generator"):
            return ImageGenerator(self.config.noise_dim, self.config.width, ctx.task)

    def loop(self) -> SynthesisConfig:
        """The synthesis loop's settings."""
        loop: SynthesisConfig = self.config.authors_loop()
        return loop

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, task = self.config, ctx.task
        teachers = client_models(payloads, ctx.dims, device=ctx.device)
        arch = ctx.server_arch or str(payloads[min(payloads)].scalars["model.arch"])
        student = shared_initial_model(ctx, arch)
        generator = self.generator(ctx)
        for t in teachers:
            t.requires_grad_(False)
        with BatchNormStatistics(teachers) as bn:
            problem = self.problem(teachers, bn, cfg, task.num_classes)
            stats = synthesise(
                generator,
                student,
                problem,
                self.loop(),
                torch_generator(ctx.seed, self.name),
                ctx.device,
                ctx.tracker,
                f"{self.name} server",
            )
            bn_layers = bn.layers
        info = {
            "student_arch": arch,
            "bn_layers": bn_layers,
            "ensemble_weights": [round(float(w), 6) for w in problem.weights],
            "pool_size": stats.pool_size,
            "generator_loss": stats.generator_loss,
            "student_loss": stats.learner_loss,
            "timings": {"server_seconds": stats.seconds},  # measured: never compared
        }
        return GlobalModel(student.eval(), info)


@register_method("dense", "DENSE: data-free KD of the client ensemble via a generator")
class Dense(DataFreeDistillation):
    """DENSE (see the module docs)."""

    Config = DenseConfig


@register_method("co_boosting", "Co-Boosting: hard-sample synthesis + ensemble re-weighting")
class CoBoosting(DataFreeDistillation):
    """Co-Boosting (see the module docs)."""

    Config = CoBoostingConfig
    problem = HardSamples
