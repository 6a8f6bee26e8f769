"""One-shot FedDF: Lin et al. (2020), "Ensemble Distillation for Robust Model Fusion in
Federated Learning" (NeurIPS), in one round.

Two forms (``form``):

* ``models`` (the paper's): clients train locally and send their model with its example
  count n_k. The server's student starts from the FedAvg average Σ_k (n_k/n)·w_k when every
  client model and the student share one architecture (the paper's initialisation), else from
  the shared initialisation of the student architecture; it is then distilled on the
  unlabelled public pool towards the uniform ensemble of the client models by minimising
  KL(teacher(x) ‖ softmax(f_s(x)/T)).
* ``predictions`` (for heterogeneous clients; FedOL's Eq. 1 with uniform weights λ_k = 1/K):
  clients send only softmax(f_k(x)/T) on the public pool; the server averages these uniformly
  and distils them, exactly as above, into a fresh ``server_model``.

The student architecture is ``server_model`` when set, else the clients' common architecture;
with heterogeneous clients and no ``server_model`` (``models`` form only) it is that of the
lowest-id client that sent a model. The ``predictions`` form needs ``server_model``.

Deviations from the paper and choices where it is vague (``FedDFConfig`` fields):

* One round, every client present: no client sampling and no server model carried across
  rounds; the teachers are the clients' ERM models from the shared recipe.
* Stopping (``epochs``): the paper distils with Adam for up to 10⁴ steps and stops early on a
  validation set; the server here has no labelled data, so it trains for ``epochs`` passes
  over the public pool (None = the server training config's ``server_epochs``) with the
  server training config (optimiser, learning rate, batch size) and no early stopping.
* Teacher (``teacher``): ``auto`` (default) is the paper's σ of the clients' *averaged
  logits* in the ``models`` form and the mean of softmax(f_k(x)/T) in the ``predictions`` form
  (predictions carry no logits). ``teacher=probabilities`` picks the mean of softmaxes in the
  ``models`` form too (the ensemble the ``ensemble`` method predicts with).
* Temperature (``temperature``): T softens teacher and student alike; the paper uses plain
  softmax (T = 1). No T² factor is applied to the loss.
* The public pool is used as it is: no data augmentation, and the teacher targets are
  computed once before distillation.
* Trust (``trust``, ``predictions`` form; not the paper's): ``agreement`` weights each
  client's predictions by its agreement with the others on the pool
  (:func:`oneshotfl.robust.agreement_trust`), so a client sending confident wrong
  predictions loses its say; ``none`` (default) is the paper's uniform average.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from oneshotfl.functional import (
    average_probabilities,
    ensemble_target,
    kl_to_student,
    weighted_member_sum,
)
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_logits, shared_initial_model
from oneshotfl.methods.common import (
    STUDENT_LIMIT,
    SendsTrainedModel,
    average_models,
    probabilities_payload,
    probabilities_spec,
    stack_probabilities,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadSpec, WireDims
from oneshotfl.robust import agreement_trust
from oneshotfl.seeding import torch_generator
from oneshotfl.training.distill import distil

Form = Literal["models", "predictions"]
Teacher = Literal["auto", "probabilities", "logits"]


@dataclass(frozen=True)
class FedDFConfig(Params):
    """FedDF hyper-parameters.

    Attributes:
        form: ``models`` (clients send models, the paper) or ``predictions`` (clients send
            public-pool probabilities; needs ``server_model``).
        temperature: softmax temperature T of teacher and student (> 0).
        teacher: ensemble of ``logits`` (softmax of the mean logits, the paper's; ``models``
            form only) or of ``probabilities`` (mean of softmaxes); ``auto`` = ``logits`` in
            the ``models`` form, ``probabilities`` in the ``predictions`` form.
        epochs: server distillation epochs (None = ``server_epochs``).
        trust: ``none`` or ``agreement`` (``predictions`` form: clients weighted by their
            agreement with the others).
    """

    form: Form = "models"
    temperature: float = 1.0
    teacher: Teacher = "auto"
    epochs: int | None = None
    trust: Literal["none", "agreement"] = "none"

    def validate(self) -> None:
        require(self.temperature > 0, "temperature", "> 0", self.temperature)
        require(
            not (self.teacher == "logits" and self.form != "models"),
            "teacher",
            "'probabilities' with form='predictions' (predictions carry no logits)",
            self.teacher,
        )
        require(self.epochs is None or self.epochs >= 1, "epochs", ">= 1 or None", self.epochs)


def choose_student(
    form: Form, server_arch: str | None, client_archs: Sequence[str]
) -> tuple[str, bool]:
    """The student architecture and whether it starts from the FedAvg average.

    Args:
        form: the method's form.
        server_arch: the configured server architecture, if any.
        client_archs: the architectures of the received client models, in client-id order
            (empty in the ``predictions`` form).

    Raises:
        ValueError: in the ``predictions`` form without a server architecture, or in the
            ``models`` form without client models.
    """
    if form == "predictions":
        if server_arch is None:
            raise ValueError(
                "feddf:form=predictions needs a server architecture: set server_model "
                "(the student cannot be a client architecture it never received)"
            )
        return server_arch, False
    if not client_archs:
        raise ValueError("feddf: expected at least one client model, got none")
    arch = server_arch or client_archs[0]
    return arch, set(client_archs) == {arch}


@register_method(
    "feddf", "FedDF: distil the client ensemble on the public pool (form=models|predictions)"
)
class FedDF(SendsTrainedModel[FedDFConfig]):
    """Ensemble distillation of client models (or their predictions) into a server student."""

    cost = (
        "clients: one local training each (or a prediction on the pool); server: the n-member "
        "ensemble on the public pool (O(n·|P|)), distillation O(|P|) an epoch"
    )

    known_limits = (STUDENT_LIMIT,)

    Config = FedDFConfig
    requires = Requires(public_data=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        if self.config.form == "predictions":
            return probabilities_spec()
        return super().payload_spec(dims)

    def client_update(self, ctx: ClientContext) -> Payload:
        if self.config.form == "predictions":
            return probabilities_payload(ctx, self.config.temperature)
        return super().client_update(ctx)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None:
            raise ValueError("feddf needs a public pool: set public_size > 0")
        cfg = self.config
        ids = sorted(payloads)
        if cfg.form == "predictions":
            arch, from_average = choose_student(cfg.form, ctx.server_arch, [])
            probs = stack_probabilities(payloads)
            target = average_probabilities(probs)
            if cfg.trust == "agreement":
                trust = agreement_trust(probs)
                if float(trust.sum()) > 0:  # nobody agreeing with anybody: the plain mean
                    target = weighted_member_sum(trust / trust.sum(), probs)
        else:
            archs = [str(payloads[c].scalars["model.arch"]) for c in ids]
            arch, from_average = choose_student(cfg.form, ctx.server_arch, archs)
            logits = client_logits(payloads, ctx.dims, ctx.public.x, ctx.device)
            teacher = "logits" if cfg.teacher == "auto" else cfg.teacher
            target = ensemble_target(logits, cfg.temperature, teacher)
        student = self._student(arch, from_average, payloads, ctx)
        self._distil(student, ctx.public.x, target, ctx)
        info = {
            "form": cfg.form,
            "teacher": "probabilities" if cfg.form == "predictions" else teacher,
            "student_arch": arch,
            "student_init": "average" if from_average else "initial",
        }
        return GlobalModel(student.eval(), info)

    def _student(
        self, arch: str, from_average: bool, payloads: Mapping[int, Payload], ctx: ServerContext
    ) -> nn.Module:
        if from_average:
            return average_models(payloads, ctx.dims)  # Σ_k (n_k/n)·w_k, the paper's start
        return shared_initial_model(ctx, arch)

    def _distil(
        self, student: nn.Module, x: torch.Tensor, target: torch.Tensor, ctx: ServerContext
    ) -> None:
        base, temperature = ctx.train_config, self.config.temperature
        distil(
            student,
            x,
            lambda logits, t: kl_to_student(logits, t, temperature),
            dataclasses.replace(base, epochs=self.config.epochs or base.epochs),
            torch_generator(ctx.seed, "feddf"),
            ctx.device,
            targets=(target,),
            tracker=ctx.tracker,
            description=f"feddf server ({self.config.form})",
        )
