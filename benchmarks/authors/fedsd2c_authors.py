"""Plugin ``fedsd2c_authors``: FedSD2C with the authors' client and server steps, unedited.

From ``Carkham/FedSD2C`` @ 5569741 (notes/issue-52/research-fedsd2c.md §5), each definition
parsed out of its file and executed alone (their modules, which import wandb and diffusers,
never run): the client ``FedSD2CClient`` (``fedsd2c/client.py``: ``load_train``,
``coreset_stage`` then ``synthesis_stage``, as their ``fedsd2c_main.py`` runs
``coreset+dist_syn`` with ``vae+fourier``, or ``vae`` at ``fourier=false``) on
``fedsd2c/util.py``'s :data:`UTIL_NAMES`, ``MultiRandomCrop``, ``Logger`` and ``AverageMeter``;
the server ``augment`` and ``FedSD2CServer`` (``fedsd2c/server.py``: ``rec_distill`` per client,
then ``train_distill``) on ``FedServer`` (its constructor and ``test``) and ``Recorder``.

The knobs are ``fedsd2c``'s, handed to their ``args`` (``ipc``, ``mipc``, ``num_crop``,
``iterations``, ``syn_lr``, ``r_c``, ``fourier``, ``fourier_lambda``, ``server_epochs``,
``server_batch``, ``server_lr``, ``server_momentum``; ``ae_*`` and ``arch`` as in ``fedsd2c``).
Those their code fixes keep its value (:class:`FedSd2cAuthorsConfig`): ``small_classes=drop``
(the default here: their ``CategoryDataset`` drops a class with at most ``ipc`` examples),
``coreset=vinfo``, ``crop_scale_min=0.08``, ``syn_weight_decay=0.01``, ``labels=logits`` (their
server runs the clients' models), ``server_weight_decay=1e-4``, ``temperature=1``,
``server_flip=true``; ``iterations >= 1`` (theirs returns nothing after 0).

Adaptations, all outside their code:

* The distiller is the client's local model, ``train_model(ctx, ctx.recipe())`` (``fedsd2c``'s;
  their README's "Step 1" models), bound as their ``ConvNet`` (:class:`Distiller`) so their
  hook branch for it runs: its ``layers["pool"]`` are one identity module four times, between
  our ``forward_features`` and head, so their hooks read φ, the head's input, as on their
  ConvNet (whose four pool entries are one module).
* Three channels, which their client hard-codes: a grey task's images are repeated ×3, held as
  H×W×3 float32 pixels (ours × std + mean; their ``ToTensor`` leaves floats unscaled) by
  :class:`PixelImages`, under the dataset name :data:`DATASET`, whose ``means``/``stds`` in our
  copy of their dicts are the run's: their ``ToTensor → Resize → Normalize`` gives our inputs
  back (to rounding); :class:`Distiller` averages the identical channels for our model.
  ``assign_dataset`` answers the run's task (theirs has no digits).
* Their ``AutoencoderKL`` is :class:`SharedAutoencoder`: ``from_pretrained`` returns
  ``fedsd2c``'s shared autoencoder (same spec and public pool: same fingerprint); ``encode``
  undoes their ``denormalize`` (ImageNet constants on every dataset) and averages a grey task's
  channels (unequal only where their unclipped Fourier mix overshoots and their per-channel
  clamp bites); ``decode(z).sample`` is our decoder's pixels (×3), which their ``Normalize``
  maps back to our inputs.
* Their client's ``np`` is :class:`NumPy124`: ``where`` of a 0-d condition answers as before
  NumPy 2 (which raises) for their donor filter (``client.py:539``), bug kept: when the position
  of the largest predicted class among a class's unselected crops equals the class, its donors
  collapse to the first unselected crop.
* Their ``FedServer`` builds the model a stubbed ``init_model`` names; ``server.model`` is then
  the federation's architecture (``union_arch``, or ``arch``) from the run's shared
  initialisation, as in ``fedd3_authors``; the teachers are the clients' models, rebuilt from
  their payloads, under int ids (their ``torch.eq``).
* The wire is what their main hands their server: the decoded distillates (channel 0 of a grey
  task's three identical ones), their labels and the client's model.
* Seeds: their main seeds ``random``, NumPy and torch once; each client step seeds them from
  the run's seed and its id, the server step from the run's seed, in a fork of the global
  generators; ``sys_i_seed`` is the run's seed, ``_device`` its device. Their logger is silent;
  ``wandb`` a stub never reached.
* Their ``train_distill`` tests after every epoch, so their server holds the test split
  (``load.test_split``, as in ``fedd3_authors``); it feeds their logged figures only: the
  outcome is the **final epoch's model**, in eval mode. Those evaluations' seconds, part of
  ``server_wall_s``, are ``authors_evaluation_s`` (when the step ran, not read from the cache),
  which ``scripts/paired.py times`` subtracts.

Their quirks, kept: the ``ipc``-mode ``SynDataset`` interleaves the crops by class but not their
labels, so (ipc > 1, two classes or more) the ``r_c`` term's targets and the labels sent are
mostly another class's (their server never reads labels); the x_p ``clip`` clamps pixel rows 0–2
of one image, not its channels; the distillate kept is the decode before the last step. Not
reproducible here: SDXL's VAE (not downloadable; far from 28- or 8-pixel grey images) and their
ResNet-18 or ConvNet. Their server runs all K teachers on every batch (K× our teacher cost).

Diagnostics, as ``fedd3_authors``: ``authors_final_test_accuracy`` (their last logged accuracy:
the final model), ``authors_max_test_accuracy_selected_on_test`` (their "Max Acc", chosen on
the test split) and its 1-based ``authors_max_test_accuracy_epoch``,
``authors_final_train_loss`` (their record: the last batch's), ``distillates``. Needs
``FEDSD2C_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import random
import sys
import types
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms as transforms
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, default_collate
from torchvision.models import ResNet
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_digest, seeded_globals, timed
from load import test_split as shared_test_split

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.encoders.autoencoder import Autoencoder
from oneshotfl.methods import builders
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedsd2c import FedSd2c
from oneshotfl.methods.fedsd2c_config import FedSd2cConfig
from oneshotfl.models.base import ClassifierModel
from oneshotfl.models.generator import input_statistics
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, ModelSpec, PayloadSpec, WireDims
from oneshotfl.seeding import derive_seed
from oneshotfl.training.services import client_artefact, train_model

ENV = "FEDSD2C_REPO"
UTIL, CLIENT, SERVER = "fedsd2c/util.py", "fedsd2c/client.py", "fedsd2c/server.py"
SERVER_BASE, RECORDER = "fed_baselines/server_base.py", "postprocessing/recorder.py"
MODELS, LOGGER, UTILS = "utils/models.py", "utils/logger.py", "utils/util.py"
FILES = (UTIL, CLIENT, SERVER, SERVER_BASE, RECORDER, MODELS, LOGGER, UTILS)
UTIL_NAMES = (
    "pad", "batched_forward", "cross_entropy", "selector_coreset", "mix_images",
    "CategoryDataset", "DistilledDataset", "DistillCIDDataset", "lr_policy", "lr_no_policy",
    "lr_cosine_policy", "mse_loss", "gram_mse_loss", "factorization_loss", "off_diagonal",
    "BNFeatureHook", "OutputHook", "means", "stds", "clip", "denormalize",
    "colorful_spectrum_mix", "SynDataset",
)  # fmt: skip
DATASET = "oneshotfl"
"""The dataset name their code is given, with the run's normalisation in their dicts."""
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
"""The mean and std their ``denormalize`` uses on every dataset."""
CACHE_VERSION = 1
SERVER_CACHE_VERSION = 2
"""2: the server step measures the seconds of their per-epoch evaluation (a step read from the
cache has none to report)."""
THEIR_LOG = logging.getLogger("fedsd2c_authors.theirs")
THEIR_LOG.addHandler(logging.NullHandler())
THEIR_LOG.propagate = False


class NumPy124(types.ModuleType):
    """NumPy, but ``where(c)`` of a 0-d ``c`` is ``where(atleast_1d(c))``, as before NumPy 2."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def where(condition: Any, *xy: Any) -> Any:
        if not xy and np.ndim(condition) == 0:
            return np.where(np.atleast_1d(condition))
        return np.where(condition, *xy)


class Unused:
    """A name their code imports but does not reach here (``wandb``, ``RandomMixup``…); called,
    it returns ``None`` (``init_model``: their server's model is replaced, module docs)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(f"fedsd2c_authors: their {self.name}.{attr} was not expected to run")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class PixelImages(Dataset[tuple[Any, int]]):
    """Images as their datasets hold them: H×W×3 float32 pixels, ``targets``, ``transform``."""

    def __init__(self, pixels: np.ndarray, targets: list[int]) -> None:
        self.data, self.targets, self.transform = pixels, targets, None

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image = self.data[i] if self.transform is None else self.transform(self.data[i])
        return image, self.targets[i]


class Distiller(nn.Module):
    """Our model as their ``ConvNet``: its four pool hooks read φ (module docs)."""

    def __init__(self, model: ClassifierModel, grey: bool) -> None:
        super().__init__()
        self.model, self.grey, self.tap = model, grey, nn.Identity()
        self.layers = nn.ModuleDict({"pool": nn.ModuleList([self.tap] * 4)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.mean(1, keepdim=True) if self.grey else x
        return self.model.head(self.tap(self.model.forward_features(x)))


class SharedAutoencoder:
    """Their ``AutoencoderKL`` (module docs); ``to``, ``eval``, ``parameters``: the model's."""

    def __init__(self, auto: Autoencoder, grey: bool) -> None:
        self.model, self.grey = auto.model, grey
        self.loaded: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def from_pretrained(self, name: str) -> SharedAutoencoder:
        self.loaded.append(name)
        return self

    def encode(self, u: torch.Tensor) -> types.SimpleNamespace:
        mean, std = (torch.tensor(v, device=u.device).view(1, 3, 1, 1) for v in IMAGENET)
        x = (u - mean) / std  # their denormalize undone: our normalised inputs
        z = self.model.encode(x.mean(1, keepdim=True) if self.grey else x)
        return types.SimpleNamespace(latent_dist=types.SimpleNamespace(mode=lambda: z))

    def decode(self, z: torch.Tensor) -> types.SimpleNamespace:
        pixels = self.model.decode(z) * self.model.std + self.model.mean
        return types.SimpleNamespace(sample=pixels.repeat(1, 3, 1, 1) if self.grey else pixels)


def their_util(task: TaskInfo) -> dict[str, Any]:
    """Their ``fedsd2c/util.py`` definitions, the run's normalisation under :data:`DATASET`."""
    scope = {"np": NumPy124("numpy"), "torch": torch, "F": F, "sqrt": math.sqrt, "Subset": Subset}
    util = authors_definitions(ENV, UTIL, UTIL_NAMES, scope)
    stats, repeat = input_statistics(task), 3 if task.in_channels == 1 else 1
    util["means"][DATASET] = list(stats.mean) * repeat
    util["stds"][DATASET] = list(stats.std) * repeat
    return util


def authors_code(task: TaskInfo, auto: Autoencoder | None = None) -> dict[str, Any]:
    """Their client and server classes and util for ``task`` (``auto`` behind their
    ``AutoencoderKL``), in one scope with the names their files import (module docs)."""
    scope: dict[str, Any] = {**their_util(task), "np": NumPy124("numpy"), "torch": torch}
    scope.update(nn=nn, F=F, transforms=transforms, DataLoader=DataLoader, deepcopy=copy.deepcopy)
    scope.update(tqdm=tqdm, random=random, math=math, defaultdict=defaultdict, json=json)
    scope.update(default_collate=default_collate, TensorDataset=TensorDataset, ResNet=ResNet)
    scope.update({n: Unused(n) for n in ("wandb", "RandomMixup", "RandomCutmix", "init_model")})
    facts = task.num_classes, task.image_size, task.in_channels  # their assign_dataset's
    scope.update(ConvNet=Distiller, assign_dataset=lambda name: facts)
    if auto is not None:
        scope["AutoencoderKL"] = SharedAutoencoder(auto, task.in_channels == 1)
    scope.update(authors_definitions(ENV, LOGGER, ("Logger",), {"logging": logging}))
    scope["Logger"].logger = THEIR_LOG
    for file, names in (
        (UTILS, ("AverageMeter",)), (MODELS, ("MultiRandomCrop",)), (CLIENT, ("FedSD2CClient",)),
        (RECORDER, ("Recorder",)), (SERVER_BASE, ("FedServer",)),
        (SERVER, ("augment", "FedSD2CServer")),
    ):  # fmt: skip
        scope.update(authors_definitions(ENV, file, names, scope))
    return scope


def their_args(cfg: FedSd2cConfig, seed: int) -> types.SimpleNamespace:
    """Their ``args``: every field their client and server read, from ``cfg`` (their local
    training fields are unused: their ``train`` is not run)."""
    return types.SimpleNamespace(
        client_instance_n_epoch=0, client_instance_bs=0, client_instance_lr=0.0,
        client_instance_mixup_alpha=0.0, client_instance_cutmix_alpha=0.0,
        fedsd2c_num_crop=cfg.num_crop, fedsd2c_mipc=cfg.mipc, fedsd2c_ipc=cfg.ipc,
        fedsd2c_iter_mode="ipc", fedsd2c_iteration=cfg.iterations, fedsd2c_lr=cfg.syn_lr,
        fedsd2c_jitter=0, fedsd2c_l2_scale=0.0, fedsd2c_tv_l2=0.0, fedsd2c_r_bn=0.0,
        fedsd2c_r_c=cfg.r_c, fedsd2c_inputs_init="vae+fourier" if cfg.fourier else "vae",
        fedsd2c_noise_type="None", fedsd2c_noise_s=0.0, fedsd2c_noise_p=0.0,
        fedsd2c_loss="mse", fourier_lambda=cfg.fourier_lambda, gpu_id=-1, sys_i_seed=seed,
        using_wandb=False, server_optimizer="SGD", server_lr_scheduler="cos",
    )  # fmt: skip


def authors_distillates(
    distiller: ClassifierModel, auto: Autoencoder, data: LabelledData, task: TaskInfo,
    cfg: FedSd2cConfig, client: int, seed: int, device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Their ``coreset_stage`` then ``synthesis_stage`` on one client's data: (the decoded
    distillates ``[N, CH, H, W]``, normalised; their labels)."""
    most = int(np.bincount(data.y.numpy(), minlength=task.num_classes).max())
    if most <= cfg.ipc:
        raise ValueError(
            f"fedsd2c_authors: client {client}: expected a class with more than ipc={cfg.ipc} "
            f"examples (their CategoryDataset drops the others), got at most {most}"
        )
    grey, stats = task.in_channels == 1, input_statistics(task)
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (stats.mean, stats.std))
    pixels = (data.x * std + mean).repeat(1, 3 if grey else 1, 1, 1).permute(0, 2, 3, 1)
    images = PixelImages(pixels.contiguous().numpy(), data.y.tolist())
    code = authors_code(task, auto)
    with seeded_globals(derive_seed(seed, "fedsd2c_authors", "client", client), device):
        theirs = code["FedSD2CClient"](their_args(cfg, seed), int(client), dataset_id=DATASET)
        theirs._device = device
        theirs.load_train(Subset(images, range(len(images))))
        theirs.coreset_stage(Distiller(distiller, grey))
        x, y = theirs.synthesis_stage(Distiller(distiller, grey))
    decoded = torch.stack(x)
    return (decoded[:, :1] if grey else decoded), torch.stack(y).long()


def authors_server(
    model: nn.Module, teachers: Mapping[int, nn.Module],
    received: Mapping[int, tuple[torch.Tensor, torch.Tensor]], test: LabelledData,
    cfg: FedSd2cConfig, task: TaskInfo, seed: int, device: torch.device,
) -> tuple[nn.Module, list[float], list[float], float]:  # fmt: skip
    """Their ``rec_distill`` per client and ``train_distill`` on ``model``: (the final model,
    their per-epoch test accuracies, their per-epoch last-batch losses, the seconds their
    per-epoch ``test`` took)."""
    code = authors_code(task)
    spent: list[float] = []
    with seeded_globals(derive_seed(seed, "fedsd2c_authors", "server"), device):
        server = code["FedSD2CServer"](
            their_args(cfg, seed), sorted(teachers), epoch=cfg.server_epochs,
            batch_size=cfg.server_batch, lr=cfg.server_lr, momentum=cfg.server_momentum,
            num_workers=0, dataset_id=DATASET, model_name="oneshotfl", i_seed=seed,
        )  # fmt: skip
        server.model, server._device = model, device  # ours, shared initialisation
        server.load_testset(TensorDataset(test.x, test.y))
        server.test = timed(server.test, spent)  # their evaluation: not the method's cost
        for c in sorted(teachers):
            x, y = received[c]
            server.rec_distill(int(c), teachers[c], code["DistilledDataset"](list(x), list(y)), [])
        server.train_distill()
    record = server.recorder.res["server"]
    accuracies = [float(a) for a in record["iid_accuracy"]]
    return server.model, accuracies, [float(v) for v in record["train_loss"]], sum(spent)


@dataclass(frozen=True)
class FedSd2cAuthorsConfig(FedSd2cConfig):
    """``fedsd2c``'s knobs; those the authors' code fixes at their value (module docs)."""

    small_classes: Literal["keep", "drop"] = "drop"

    def validate(self) -> None:
        super().validate()
        fixed: dict[str, object] = {
            "small_classes": "drop", "coreset": "vinfo", "crop_scale_min": 0.08,
            "syn_weight_decay": 0.01, "labels": "logits", "server_weight_decay": 1e-4,
            "temperature": 1.0, "server_flip": True,
        }  # fmt: skip
        for name, value in fixed.items():
            got = getattr(self, name)
            require(got == value, name, f"{value!r} (fixed in the authors' code)", got)
        require(self.iterations >= 1, "iterations", ">= 1 (their synthesis)", self.iterations)


def digest(*arrays: np.ndarray) -> str:
    """SHA-256 over the arrays' bytes."""
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


@register_method("fedsd2c_authors", "FedSD2C, the authors' client and server steps (plugin)")
class FedSd2cAuthors(FedSd2c):
    """The authors' FedSD2C client and server steps on our clients' data (module docs)."""

    Config = FedSd2cAuthorsConfig
    config: FedSd2cAuthorsConfig

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        labels = ArraySpec("y", ("N",), ("int64",), value_range=(0, dims.num_classes - 1))
        x = ArraySpec("x", ("N", "CH", "H", "W"))
        return PayloadSpec(arrays=(x, labels), models=(ModelSpec(),))

    def client_update(self, ctx: ClientContext) -> Payload:
        cfg, auto = self.config, self.autoencoder(ctx)
        distiller = train_model(ctx, ctx.recipe())
        assert isinstance(distiller, ClassifierModel)
        key = {
            "version": CACHE_VERSION, "authors": authors_digest(ENV, FILES),
            "fedsd2c_authors": dataclasses.asdict(cfg), "autoencoder": auto.fingerprint,
            "distiller": ctx.recipe().key(), "device": ctx.device.type,
        }  # fmt: skip

        def make() -> Payload:
            x, y = authors_distillates(
                distiller, auto, ctx.data, ctx.task, cfg, ctx.client_id, ctx.seed, ctx.device
            )
            return Payload({"x": x.float().cpu().numpy(), "y": y.cpu().numpy()})

        made = client_artefact(ctx, "fedsd2c_authors", key, make, "FedSD2C (authors' code)")
        return Payload(dict(made.arrays)).merged(model_fields(copy.deepcopy(distiller).cpu()))

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, order = self.config, sorted(payloads)
        arch = builders.union_arch(ctx, "fedsd2c_authors", cfg.arch)
        members = builders.client_models(payloads, ctx.dims, device=ctx.device)
        teachers = dict(zip(order, members, strict=True))
        arrays = {c: payloads[c].arrays for c in order}
        received = {
            c: (torch.from_numpy(a["x"]), torch.from_numpy(a["y"])) for c, a in arrays.items()
        }
        test = shared_test_split(ctx.task, "fedsd2c_authors")

        evaluation: list[float] = []

        def make() -> Payload:
            trained, accuracies, losses, seconds = authors_server(
                builders.shared_initial_model(ctx, arch), teachers, received, test, cfg, ctx.task,
                ctx.seed, ctx.device,
            )  # fmt: skip
            evaluation.append(seconds)
            curves = {
                "authors.test_accuracy": np.asarray(accuracies, np.float64),
                "authors.train_loss": np.asarray(losses, np.float64),
            }
            return model_fields(trained.cpu()).merged(Payload(curves))

        sent = [payloads[c].arrays[k] for c in order for k in sorted(payloads[c].arrays)]
        parts = {
            "version": SERVER_CACHE_VERSION, "authors": authors_digest(ENV, FILES),
            "clients": order,
            "archs": [str(payloads[c].scalars["model.arch"]) for c in order],
            "data": digest(*sent), "test": digest(test.x.numpy(), test.y.numpy()),
            "train": [cfg.server_epochs, cfg.server_batch, cfg.server_lr, cfg.server_momentum],
            "device": ctx.device.type, **builders.initial_model_parts(ctx, arch),
        }  # fmt: skip
        made, _ = ctx.store.get_or_make("fedsd2c_authors_server", parts, make, "fedsd2c_authors")
        accuracies = made.arrays["authors.test_accuracy"]
        best = int(np.argmax(accuracies))
        info = {
            "distillates": float(sum(len(y) for _, y in received.values())),
            "clients_used": float(len(order)),
            "authors_final_test_accuracy": float(accuracies[-1]),
            "authors_max_test_accuracy_selected_on_test": float(accuracies[best]),
            "authors_max_test_accuracy_epoch": float(best + 1),
            "authors_final_train_loss": float(made.arrays["authors.train_loss"][-1]),
        }
        if evaluation:  # run here, not read from the cache: part of server_wall_s
            info["authors_evaluation_s"] = evaluation[0]
        return GlobalModel(model_from_fields(made, ctx.dims).eval(), info)
