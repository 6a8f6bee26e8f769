"""Two toy methods that prove the core carries new shapes of method in a few lines each
(``tests/test_extending.py`` runs them and checks their length): a peer method and a
generator-based (data-free) method. Neither is registered globally: tests register them in a
scope with :func:`helpers.registered`.

They are documented example plugins (``docs/adding-a-method.md``): they import from the plugin
API, ``oneshotfl.extend``, and nothing else of oneshotfl, and ``tests/plugin_api.json`` pins
their code to its version — a change of oneshotfl that makes them need an edit changes the
version (``tests/test_plugin_api.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.extend import (
    BatchNormStatistics,
    ClientContext,
    GlobalModel,
    NoAugmentation,
    NoConfig,
    Outcome,
    Payload,
    PeerMethod,
    Requires,
    SendsTrainedModel,
    ServerContext,
    SynthesisConfig,
    Topology,
    average_models,
    kl_to_student,
    model_fields,
    model_from_fields,
    seeded_torch,
    shared_initial_model,
    synthesise,
    torch_generator,
    train_model,
)


class NeighbourAverage(PeerMethod[NoConfig], SendsTrainedModel[NoConfig]):
    """Toy peer method: each client's model is the size-weighted parameter average of its
    own model and the models its graph neighbours sent (one-shot gossip averaging)."""

    requires = Requires(topology=Topology.PEER, same_architecture=True)

    def aggregate_for(self, ctx: ClientContext, payloads: Mapping[int, Payload]) -> Outcome:
        own = model_fields(train_model(ctx, ctx.recipe()).cpu()).merged(
            Payload({}, {"n_examples": len(ctx.data)})
        )
        return GlobalModel(average_models({ctx.client_id: own, **payloads}, ctx.dims))


class Generator(nn.Module):
    """(noise, label) → an image in [-1, 1]."""

    def __init__(self, noise: int, classes: int, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.classes, self.shape = classes, shape
        self.net = nn.Sequential(nn.Linear(noise + classes, 64), nn.ReLU())
        self.out = nn.Sequential(nn.Linear(64, prod(shape)), nn.Tanh())

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.classes).to(z.dtype)
        return self.out(self.net(torch.cat([z, onehot], 1))).view(-1, *self.shape)


@dataclass
class DistilFromNoise(NoAugmentation):
    """Generator: CE of the teachers on the wanted label + BatchNorm statistics (DENSE's first
    two terms); learner: KL to the teachers' mean softmax on the generated batch."""

    teachers: list[nn.Module]
    bn: BatchNormStatistics
    noise: int
    classes: int

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, self.noise, generator=gen), torch.randint(
            self.classes, (n,), generator=gen
        )

    def teacher(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([t(x) for t in self.teachers]).softmax(-1).mean(0)

    def generator_loss(self, x: torch.Tensor, y: torch.Tensor, learner: nn.Module) -> torch.Tensor:
        self.bn.clear()
        return F.nll_loss(self.teacher(x).clamp_min(1e-8).log(), y) + self.bn.loss()

    def learner_loss(self, learner: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x)
        return kl_to_student(learner(x), target).mean()


class DataFreeDistillation(SendsTrainedModel[NoConfig]):
    """Toy generator-based method: a student distilled from the client ensemble on data a
    generator synthesises from noise (no public data); the shared synthesis loop trains both."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        task = ctx.task
        teachers = [model_from_fields(p, ctx.dims).to(ctx.device) for p in payloads.values()]
        student = shared_initial_model(ctx, ctx.server_arch or ctx.client_archs[0])
        shape = (task.in_channels, task.image_size, task.image_size)
        with seeded_torch(ctx.seed, "toy", "generator"):
            generator = Generator(16, task.num_classes, shape)
        cfg = SynthesisConfig(5, 2, 4, 32, 16, 1e-3, 1e-2)
        with BatchNormStatistics(teachers) as bn:
            problem = DistilFromNoise(teachers, bn, 16, task.num_classes)
            rng = torch_generator(ctx.seed, "toy", "synthesis")
            stats = synthesise(generator, student, problem, cfg, rng, ctx.device)
        return GlobalModel(student, {"bn_layers": bn.layers, "learner_loss": stats.learner_loss})
