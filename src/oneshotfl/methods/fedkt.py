"""FedKT: Li, He and Song (2021), "Practical One-Shot Federated Learning for Cross-Silo
Setting" (IJCAI), a two-tier PATE (Papernot et al. 2017/2018) for one-shot FL.

On each client (party) k, for each of ``partitions`` (s) random splits of its data:

1. split the local data into ``teachers`` (t) disjoint parts and train one teacher per part;
2. the t teachers label the public pool by majority vote (per sample, the class with the
   most teacher votes, after adding Laplace noise of scale 1/``client_noise_gamma`` to the
   vote counts when that is > 0: example-level privacy);
3. train a student on the public pool with those labels.

The client sends its s students. The server lets every student label the public pool and
takes the vote over all clients (with ``consistent_voting``, a client's s students give s
votes to their label only when they all agree, else none — the paper's consistent voting,
which bounds one client's influence on a label), adds Laplace noise of scale
1/``server_noise_gamma`` to the counts when that is > 0 (client-level privacy), and trains the
final model on the public pool with the voted labels.

Choices where the paper leaves room (``FedKTConfig`` fields):

* Models: teachers and students use the client's architecture; the final model is
  ``server_model`` when set, else the architecture of the lowest-id client.
* Training: teachers train with the client training config; students with it too, for
  ``student_epochs`` (None = the client epochs); the final model with the server training
  config. No early stopping anywhere (no party holds labelled public data). The federation's
  step floor (``local_steps``) holds for each of them over its own data: every teacher, on its
  1/t of the client's data, and every student make at least that many steps, so a client
  trains s·(t + 1) floored models (``local_steps=0`` for epochs alone).
* ``query_fraction``: the share of the public pool that is labelled and trained on (PATE's
  queries); a seeded random subset, the same for every party.
* Public samples that get no vote at all at the server (possible only with consistent
  voting and no server noise) are left out of the final training set.
* Privacy accounting (the moments accountant of PATE) is not computed: the noise is applied
  as the paper specifies, but no ε is reported.
* A client with fewer examples than teachers raises an error naming both numbers.

Compared with the official code (github.com/QinbinLi/FedKT): the structure, consistent
voting and Laplace(1/γ) report-noisy-max at either tier match (its ``dp_level=1`` is our
``server_noise_gamma``, ``dp_level=2`` our ``client_noise_gamma``); its defaults differ —
100 epochs for teachers, students and the final model with Adam (lr 1e-3), and half of the
public data queried (``query_fraction=0.5`` here) — where ours reuse the federation's short
client and server training budgets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import consistent_vote_counts, noisy_argmax, vote_counts
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import client_logits, seeded_model, shared_initial_model
from oneshotfl.methods.common import STUDENT_LIMIT
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ModelSpec, PayloadSpec, WireDims, n_examples_spec
from oneshotfl.seeding import numpy_rng, torch_generator
from oneshotfl.training.loop import predict_logits, train_classifier
from oneshotfl.training.services import client_artefact


@dataclass(frozen=True)
class FedKTConfig(Params):
    """FedKT hyper-parameters.

    Attributes:
        partitions: s, students per client (each from its own split of the data).
        teachers: t, teachers per split (disjoint parts of the client's data).
        student_epochs: student training epochs (None = the client training epochs).
        client_noise_gamma: γ of the Laplace(1/γ) noise on the teachers' vote counts
            (0 = no noise).
        server_noise_gamma: γ of the Laplace(1/γ) noise on the server's vote counts
            (0 = no noise).
        consistent_voting: a client's students vote only when they all agree.
        query_fraction: share of the public pool labelled and trained on, in (0, 1].
    """

    partitions: int = 2
    teachers: int = 5
    student_epochs: int | None = None
    client_noise_gamma: float = 0.0
    server_noise_gamma: float = 0.0
    consistent_voting: bool = True
    query_fraction: float = 1.0

    def validate(self) -> None:
        require(self.partitions >= 1, "partitions", ">= 1", self.partitions)
        require(self.teachers >= 1, "teachers", ">= 1", self.teachers)
        epochs = self.student_epochs
        require(epochs is None or epochs >= 1, "student_epochs", ">= 1 or None", epochs)
        gamma = self.client_noise_gamma
        require(gamma >= 0, "client_noise_gamma", ">= 0", gamma)
        require(self.server_noise_gamma >= 0, "server_noise_gamma", ">= 0", self.server_noise_gamma)
        require(0 < self.query_fraction <= 1, "query_fraction", "in (0, 1]", self.query_fraction)


def disjoint_parts(n: int, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random split of ``range(n)`` into ``parts`` disjoint, near-equal index sets.

    Raises:
        ValueError: when there are fewer items than parts.
    """
    if n < parts:
        raise ValueError(f"fedkt: expected at least {parts} examples to split, got {n}")
    return [np.sort(p) for p in np.array_split(rng.permutation(n), parts)]


def query_indices(n: int, fraction: float, seed: int) -> torch.Tensor:
    """The public samples PATE queries: a seeded subset of ``fraction·n`` (all when 1)."""
    if fraction >= 1:
        return torch.arange(n)
    size = max(1, round(fraction * n))
    chosen = numpy_rng(seed, "fedkt", "queries").choice(n, size=size, replace=False)
    return torch.from_numpy(np.sort(chosen))


@register_method("fedkt", "FedKT: two-tier PATE voting (teachers → students → server vote)")
class FedKT(Method[FedKTConfig]):
    """FedKT (Li, He, Song 2021): per-client teacher votes → students; server student vote."""

    cost = (
        "clients: s students each on their own shard (O(s·N)); server: the vote of n·s students"
        " on the public pool (O(n·s·|P|))"
    )

    known_limits = (STUDENT_LIMIT,)

    Config = FedKTConfig
    requires = Requires(public_data=True)

    def _student_prefix(self, j: int) -> str:
        return f"student{j}"

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        return PayloadSpec(
            models=tuple(ModelSpec(self._student_prefix(j)) for j in range(self.config.partitions)),
            scalars=(n_examples_spec(),),
        )

    def client_update(self, ctx: ClientContext) -> Payload:
        if ctx.public is None:
            raise ValueError("fedkt needs a public pool: set public_size > 0")
        parts = {
            "config": dataclasses.asdict(self.config),
            "public": len(ctx.public),
            "arch": ctx.arch,
            "train": ctx.train_config.as_dict(),
        }
        payload = client_artefact(
            ctx, "fedkt_students", parts, lambda: self._students(ctx), "students"
        )
        kept = {k: v for k, v in payload.scalars.items() if k != "train_seconds"}
        return Payload(payload.arrays, kept)

    def _students(self, ctx: ClientContext) -> Payload:
        assert ctx.public is not None
        cfg, seconds = self.config, 0.0
        queries = query_indices(len(ctx.public), cfg.query_fraction, ctx.seed)
        public_x = ctx.public.x[queries]
        student_cfg = dataclasses.replace(
            ctx.train_config, epochs=cfg.student_epochs or ctx.train_config.epochs
        )
        out = Payload({}, {"n_examples": len(ctx.data)})
        for j in range(cfg.partitions):
            rng = numpy_rng(ctx.seed, "fedkt", ctx.client_id, "split", j)
            votes = []
            for i, idx in enumerate(disjoint_parts(len(ctx.data), cfg.teachers, rng)):
                teacher = self._model(ctx, "teacher", j, i)
                part = torch.from_numpy(idx)
                stats = train_classifier(
                    teacher,
                    LabelledData(ctx.data.x[part], ctx.data.y[part]),
                    ctx.train_config,
                    torch_generator(ctx.seed, "fedkt", ctx.client_id, "teacher", j, i),
                    ctx.device,
                    tracker=ctx.tracker,
                    description=f"client {ctx.client_id} fedkt teacher {j}.{i}",
                )
                seconds += stats.seconds
                votes.append(predict_logits(teacher, public_x, ctx.device).argmax(dim=-1))
            counts = vote_counts(torch.stack(votes), ctx.task.num_classes)
            noise_rng = numpy_rng(ctx.seed, "fedkt", ctx.client_id, "noise", j)
            labels = noisy_argmax(counts, cfg.client_noise_gamma, noise_rng)
            student = self._model(ctx, "student", j, 0)
            stats = train_classifier(
                student,
                LabelledData(public_x, labels),
                student_cfg,
                torch_generator(ctx.seed, "fedkt", ctx.client_id, "student", j),
                ctx.device,
                tracker=ctx.tracker,
                description=f"client {ctx.client_id} fedkt student {j}",
            )
            seconds += stats.seconds
            out = out.merged(model_fields(student.cpu(), self._student_prefix(j)))
        return out.merged(Payload({}, {"train_seconds": seconds}))

    @staticmethod
    def _model(ctx: ClientContext, role: str, j: int, i: int) -> torch.nn.Module:
        """A fresh model of the client's architecture, its own seeded initialisation."""
        model = seeded_model(ctx, "fedkt", ctx.client_id, role, j, i)
        return model.to(ctx.device)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        if ctx.public is None:
            raise ValueError("fedkt needs a public pool: set public_size > 0")
        cfg, ids = self.config, sorted(payloads)
        num_classes = ctx.task.num_classes
        queries = query_indices(len(ctx.public), cfg.query_fraction, ctx.seed)
        public_x = ctx.public.x[queries]
        cpu = torch.device("cpu")  # predict_logits answers on the CPU, so do the votes
        counts = torch.zeros(len(queries), num_classes, dtype=torch.float64, device=cpu)
        students = torch.stack(  # [K clients, s students, N]: every student's label
            [
                client_logits(payloads, ctx.dims, public_x, ctx.device, self._student_prefix(j))
                for j in range(cfg.partitions)
            ],
            dim=1,
        ).argmax(dim=-1)
        vote = consistent_vote_counts if cfg.consistent_voting else vote_counts
        for labels in students:  # one client's votes, in client-id order
            counts += vote(labels, num_classes)
        labels = noisy_argmax(
            counts, cfg.server_noise_gamma, numpy_rng(ctx.seed, "fedkt", "server")
        )
        keep = (
            counts.sum(dim=-1) > 0
            if cfg.server_noise_gamma == 0
            else torch.ones(len(labels), dtype=torch.bool)
        )
        if not keep.any():
            raise ValueError(
                "fedkt: no public sample got a vote (every client's students disagree)"
            )
        arch = ctx.server_arch or str(payloads[ids[0]].scalars[f"{self._student_prefix(0)}.arch"])
        final = shared_initial_model(ctx, arch)
        train_classifier(
            final,
            LabelledData(public_x[keep], labels[keep]),
            ctx.train_config,
            torch_generator(ctx.seed, "fedkt", "final"),
            ctx.device,
            tracker=ctx.tracker,
            description="fedkt final model",
        )
        info: dict[str, Any] = {
            "final_arch": arch,
            "labelled_fraction": float(keep.double().mean()),
            "label_histogram": torch.bincount(labels[keep], minlength=num_classes).tolist(),
        }
        return GlobalModel(final.eval(), info)
