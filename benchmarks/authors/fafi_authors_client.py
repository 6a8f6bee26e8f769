"""Plugin ``fafi_authors_client``: FAFI with the authors' client *and* server steps, unedited.

The server step is ``fafi_authors``' (subclassed: their ``our_main.py`` 183–188, 268–274). Each
client runs, from ``zenghui9977/FAFI_ICML25`` @ 26cf90e, definitions parsed out of their files
and executed alone (their modules, which import visdom, cv2 and pytorch_grad_cam, never run):

* ``ours_local_training`` (``oneshot_algorithms/ours/our_local_training.py`` 6–66) with what it
  calls: ``SupConLoss``, ``Contrastive_proto_feature_loss``, ``Contrastive_proto_loss``
  (``unsupervised_loss.py`` 3–96, 138–170), ``init_optimizer``, ``test_acc``,
  ``save_best_local_model`` (``oneshot_algorithms/utils.py`` 120–127, 144–163, 24–28);
* their model, ``LearnableProtoResNet`` (``models_lib/resnet_big.py`` 279–306: ``encoder``,
  ``learnable_proto`` = ``torch.randn(C, F)``, their forward), via ``get_train_models``
  (``models_lib/__init__.py`` 5–31);
* their data pieces: ``get_client_dataloader`` (``dataset_helper.py`` 234–240: a
  ``SubsetRandomSampler``, ``drop_last=True``), ``NORMALIZE_DICT`` (10–18),
  ``get_supcon_transform`` and ``generate_sample_per_class`` (``our_main.py`` 9–31, 67–75);
* their driver ``OneshotOurs`` (``our_main.py``) for a federation of one (``c = 0``): 164–171
  (model built, ``.to``, ``.train``), 180 (deep-copied), 190 (the transform), then for each
  ``cr`` (the loop header is ours) 215–219 (the loader; at round 0 their class counts, which
  draw from the sampler and are never read) and 223–241 (their function on a deep copy).

Knobs: ``fafi``'s, refused at any value but the one their code fixes (``temperature=0.07``,
``prototype_std=1``, ``grad_clip=1``, ``crop_area=0.2``, ``draw=batch``, ``weighting=size``),
and ``epochs_per_call`` (their ``local_epochs``: the optimiser, momentum included, is rebuilt
at every call; 1 as their CIFAR-10 configs, 5 as SVHN's; 0: one call). The budget is the
run's, as ``fafi``'s: ``epochs`` (as resolved for the client; their ``num_rounds`` = epochs /
``epochs_per_call``; no step floor), ``batch_size``, ``lr``, ``momentum``, ``optimizer`` (their
``init_optimizer``: ``sgd`` or ``adam``, no weight decay: ``adamw`` or a ``weight_decay`` is
refused). Fixed at theirs: ``save_freq`` 5, test batch 256, ``loss_name`` ``ce`` (unread).

Adaptations, all outside their code:

* Model: their ``model_dict`` has one entry, whose constructor returns the run's shared
  initialisation of the client's architecture behind ``fafi_authors``' ``Features`` (their
  ``encoder`` is our ``forward_features``), its width our feature width. Lines 164–171 run
  with torch's generator seeded as ``fafi`` draws its prototypes, so every client starts from
  the same encoder and P, ``fafi``'s bits (theirs: one draw, deep-copied). The trained P is
  sent as the head's weights (bias 0): ``fafi``'s message, spec and wire checks.
* Data: their ``trainset`` is the client's examples as pixels (our inputs × std + mean, as
  their ``ToTensor`` gives CIFAR-10), ``client_idx_map`` all of them. Their transform is built
  for a dataset name of ours whose ``NORMALIZE_DICT`` entry is the run's statistics (theirs:
  0.5/0.5 on CIFAR-10; training and test inputs are normalised alike), and its crop's side is
  set to the run's (their code: 32 on CIFAR-10/100 and SVHN, else 64). Grey images pass as
  they are (torchvision's saturation, hue and grey steps leave one channel unchanged).
* Their per-epoch ``test_acc`` (logged only) scores, as its test loader, the client's own
  pixels (a client holds no test split) in shuffled batches of 256 (their ``test.py:27``).
  Their ``logger`` is private (its lines give the facts below), their checkpoints go to a
  temporary folder, torch's pinned-memory warning without an accelerator is silenced.
* Seeds: their ``setup_seed`` seeds ``random``, NumPy and torch once, cuDNN deterministic;
  each client's lines 190–241 run with them seeded from the run's seed and the client's id,
  in a fork of the global generators, restored after.
* A client smaller than one batch: their loader is empty, no step is taken, and their
  ``test_acc`` of it divides by zero (``utils.py:162``), ending their run; here that error
  (with an empty loader only) ends the client's training: it sends its initial model.

Quirks kept: every shuffled epoch leaves out n mod ``batch_size`` examples (``drop_last``)
that the server's weights n_k count; one augmentation draw per view of a batch; their
``test_acc`` of the training loader scores un-normalised pixels; L_pf repeats L_ce; L_pp's
mask is unused; their model is returned in training mode (``trained`` hands it in eval mode).

How their client step differs from ``fafi``'s: ``fafi`` trains every example (``fit``'s
batches, no ``drop_last``); its views are its own warp (a crop may cross the edge, jitter in a
fixed order without hue, channel means for grey, one clamp), theirs torchvision's
``RandomResizedCrop`` / ``ColorJitter`` (random order, hue 0.1) / ``RandomGrayscale``; it runs
one optimiser over the budget with the run's weight decay (theirs: rebuilt every call,
``our_local_training.py:10``, none); it shuffles from a named generator (theirs: torch's
global one); it does not evaluate while training (theirs: two ``test_acc`` passes and two
model copies an epoch, ``:57-58``). The loss is the same four terms.

Client facts: ``authors_calls``, ``authors_steps`` (optimiser steps), ``authors_untrained``,
and from their last epoch's log line (``:60``) ``authors_final_epoch_loss`` (a sum over its
batches) and ``authors_train_accuracy``. It loads ``fafi_authors.py`` as a plugin unless
``fafi_authors`` is registered (list that file first, if at all). Needs ``FAFI_REPO``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from logging.handlers import BufferingHandler
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_digest, authors_lines, seeded_globals

from oneshotfl import plugins
from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.methods import METHODS
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import initial_model_parts, shared_initial_model
from oneshotfl.methods.fafi import Fafi, FafiConfig
from oneshotfl.models.base import ClassifierModel
from oneshotfl.models.generator import input_statistics
from oneshotfl.params import is_int, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.seeding import derive_seed, seeded_torch
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.services import client_artefact


def server_plugin() -> ModuleType:
    """``fafi_authors.py``'s module: the registered one, else that file imported as a plugin."""
    if "fafi_authors" not in METHODS:
        plugins.import_plugin(str(Path(__file__).resolve().parent / "fafi_authors.py"))
    return sys.modules[METHODS.get("fafi_authors").__module__]


SERVER = server_plugin()
if TYPE_CHECKING:
    FafiAuthors = Fafi
else:
    FafiAuthors = SERVER.FafiAuthors

ENV: str = SERVER.ENV
MAIN, LOCAL = SERVER.FILE, "oneshot_algorithms/ours/our_local_training.py"
LOSSES, UTILS = "oneshot_algorithms/ours/unsupervised_loss.py", "oneshot_algorithms/utils.py"
DATA, MODELS, RESNET = "dataset_helper.py", "models_lib/__init__.py", "models_lib/resnet_big.py"
FILES = (MAIN, LOCAL, LOSSES, UTILS, DATA, MODELS, RESNET)
DEFINITIONS = (
    (DATA, ("NORMALIZE_DICT", "get_client_dataloader")),
    (RESNET, ("LearnableProtoResNet",)),
    (MODELS, ("get_train_models",)),
    (UTILS, ("init_optimizer", "test_acc", "save_best_local_model")),
    (LOSSES, ("SupConLoss", "Contrastive_proto_feature_loss", "Contrastive_proto_loss")),
    (MAIN, ("get_supcon_transform", "generate_sample_per_class")),
    (LOCAL, ("ours_local_training",)),
)  # in an order where each file's names are bound before a later file's code reads them
BUILD, COPY, TRANSFORM = (164, 171), (180, 180), (190, 190)
LOADER, TRAIN = (215, 219), (223, 241)
"""Their ``OneshotOurs`` lines (``our_main.py``), whole statements."""
NAME = "oneshotfl"
"""The dataset and model name their code is given (module docs)."""
SAVE_FREQ, TEST_BATCH = 5, 256
"""Their configs' ``save_freq`` and ``test_batch_size``."""
CACHE_VERSION = 1
THEIR_LOG = logging.getLogger("fafi_authors_client.theirs")
THEIR_LOG.addHandler(logging.NullHandler())
THEIR_LOG.propagate = False
THEIR_LOG.setLevel(logging.INFO)
EPOCH_LINE = re.compile(r"Epoch \d+ loss: (\S+); train accuracy: (\S+); test accuracy: ")


@dataclass
class Trace:
    """What their client step did: calls of their function, optimiser steps, their log lines,
    and whether their loader was empty."""

    calls: int = 0
    steps: int = 0
    said: BufferingHandler = field(default_factory=lambda: BufferingHandler(sys.maxsize))
    untrained: bool = False

    def step(self, *_: Any) -> None:
        """An optimiser's step hook: one step more."""
        self.steps += 1

    def facts(self) -> dict[str, float]:
        """The client facts (module docs)."""
        facts = {"authors_calls": float(self.calls), "authors_steps": float(self.steps)}
        facts["authors_untrained"] = float(self.untrained)
        lines = [record.getMessage() for record in self.said.buffer]
        logged = [m for line in lines if (m := EPOCH_LINE.match(line))]
        if logged:
            facts["authors_final_epoch_loss"] = float(logged[-1][1])
            facts["authors_train_accuracy"] = float(logged[-1][2])
        return facts


def counting(init_optimizer: Any, trace: Trace) -> Any:
    """Their ``init_optimizer``, its optimisers' steps counted into ``trace``."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        optimizer = init_optimizer(*args, **kwargs)
        optimizer.register_step_post_hook(trace.step)
        return optimizer

    return counted


def their_code(task: TaskInfo, trace: Trace, model_dict: dict[str, Any]) -> dict[str, Any]:
    """Their client definitions in one scope with the names their files import, the run's
    normalisation under :data:`NAME`, their optimiser's steps and their function's calls
    counted into ``trace`` (wrappers: their code runs as written)."""
    scope: dict[str, Any] = {"torch": torch, "nn": nn, "F": F, "copy": copy, "os": os}
    scope.update(torchvision=torchvision, logger=THEIR_LOG, model_dict=model_dict)
    for file, names in DEFINITIONS:
        scope.update(authors_definitions(ENV, file, names, scope))
        if file == UTILS:  # before their function is defined: what its :10 calls
            scope["init_optimizer"] = counting(scope["init_optimizer"], trace)
    their_training = scope["ours_local_training"]

    def ours_local_training(*args: Any, **kwargs: Any) -> Any:
        trace.calls += 1
        return their_training(*args, **kwargs)

    scope["ours_local_training"] = ours_local_training
    stats = input_statistics(task)
    scope["NORMALIZE_DICT"][NAME] = {"mean": tuple(stats.mean), "std": tuple(stats.std)}
    return scope


def their_config(task: TaskInfo, train: TrainConfig, per_call: int) -> dict[str, Any]:
    """The fields of their config their lines read, from the run's budget."""
    return {
        "dataset": {"data_name": NAME, "num_classes": task.num_classes,
                    "train_batch_size": train.batch_size},
        "server": {"model_name": NAME, "local_epochs": per_call, "optimizer": train.optimizer,
                   "lr": train.lr, "momentum": train.momentum, "loss_name": "ce"},
        "client": {"num_clients": 1},
        "checkpoint": {"save_freq": SAVE_FREQ},
    }  # fmt: skip


def authors_client_step(
    initial: ClassifierModel, data: LabelledData, task: TaskInfo, train: TrainConfig,
    per_call: int, seed: int, arch: str, client: int, device: torch.device,
) -> tuple[ClassifierModel, Trace]:  # fmt: skip
    """Their client step (module docs) from ``initial`` (the run's shared initialisation of
    ``arch``) on one client's ``data`` (normalised inputs): the trained model, its prototypes
    as the head's weights, on the CPU in eval mode; and what their step did."""
    per_call = per_call or train.epochs  # their num_rounds × local_epochs = epochs
    if per_call and train.epochs % per_call:
        raise ValueError(
            f"fafi_authors_client: expected epochs a multiple of epochs_per_call={per_call}, "
            f"got {train.epochs}"
        )
    rounds = train.epochs // per_call if per_call else 0
    stats = input_statistics(task)
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (stats.mean, stats.std))
    pixels = data.x.cpu() * std + mean
    trace = Trace()
    width = int(initial.head.weight.shape[1])
    ns = their_code(task, trace, {NAME: [lambda: SERVER.Features(initial), width]})
    ns.update(config=their_config(task, train, per_call), device=device, c=0)
    ns.update(trainset=TensorDataset(pixels, data.y.cpu()), client_idx_map={0: [*range(len(data))]})
    with seeded_torch(seed, "init", arch, "fafi prototypes"):  # fafi's draw of P
        ns = authors_lines(ENV, MAIN, *BUILD, ns)
    ns = authors_lines(ENV, MAIN, *COPY, ns)
    THEIR_LOG.addHandler(trace.said)
    try:
        with (
            seeded_globals(
                derive_seed(seed, "fafi_authors_client", "client", client), device, True
            ),
            tempfile.TemporaryDirectory() as folder,
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
            ns = authors_lines(ENV, MAIN, *TRANSFORM, ns)
            crop = ns["aug_transformer"].transforms[0]
            assert isinstance(crop, torchvision.transforms.RandomResizedCrop)
            crop.size = (task.image_size, task.image_size)
            tests = DataLoader(TensorDataset(pixels, data.y.cpu()), TEST_BATCH, shuffle=True)
            ns.update(clients_sample_per_class=[], local_model_dir=folder, test_loader=tests)
            for cr in range(rounds):
                ns["cr"] = cr
                ns = authors_lines(ENV, MAIN, *LOADER, ns)
                try:
                    ns = authors_lines(ENV, MAIN, *TRAIN, ns)
                except ZeroDivisionError:
                    if len(ns["client_dataloader"]) > 0:
                        raise
                    trace.untrained = True
                    break
    finally:
        THEIR_LOG.removeHandler(trace.said)
    theirs = ns["local_models"][0]
    model: ClassifierModel = theirs.encoder.model
    with torch.no_grad():
        model.head.weight.copy_(theirs.learnable_proto)
        if model.head.bias is not None:
            model.head.bias.zero_()
    return model.cpu().eval(), trace


@dataclass(frozen=True)
class FafiAuthorsClientConfig(FafiConfig):
    """``fafi``'s knobs at the values the authors' code fixes, and ``epochs_per_call`` (module
    docs).

    Attributes:
        epochs_per_call: epochs a call of their function trains (their ``local_epochs``; the
            optimiser is rebuilt at each call); 0: one call for the whole budget.
    """

    epochs_per_call: int = 1

    def validate(self) -> None:
        super().validate()
        fixed: dict[str, object] = {
            "temperature": 0.07, "prototype_std": 1.0, "grad_clip": 1.0, "crop_area": 0.2,
            "draw": "batch", "weighting": "size",
        }  # fmt: skip
        for name, value in fixed.items():
            got = getattr(self, name)
            require(got == value, name, f"{value!r} (fixed in the authors' code)", got)
        n = self.epochs_per_call
        require(is_int(n, 0), "epochs_per_call", "an int >= 0 (0: one call)", n)


@register_method("fafi_authors_client", "FAFI, the authors' client and server steps (plugin)")
class FafiAuthorsClient(FafiAuthors):
    """The authors' FAFI client step on our clients' data and architecture; their server step
    (``fafi_authors``); ``fafi``'s message (module docs)."""

    Config = FafiAuthorsClientConfig
    config: FafiAuthorsClientConfig
    cost = (
        "clients: one local training each on two augmented views a step, plus their two "
        "evaluation passes and a model copy an epoch; server: as fafi_authors"
    )

    def setting_problems(self, client_train: TrainConfig) -> list[str]:
        problems = []
        if client_train.optimizer not in ("sgd", "adam") or client_train.weight_decay:
            problems.append(
                "the authors' init_optimizer (utils.py:120-127) builds SGD or Adam without "
                f"weight decay, got optimizer={client_train.optimizer} "
                f"weight_decay={client_train.weight_decay}"
            )
        per_call = self.config.epochs_per_call
        if per_call and client_train.epochs % per_call:
            problems.append(
                f"expected epochs a multiple of epochs_per_call={per_call}, "
                f"got {client_train.epochs}"
            )
        return problems

    def _artefact(self, ctx: ClientContext) -> Payload:
        cfg, train = self.config, ctx.train_config
        parts = {
            "version": CACHE_VERSION, "authors": authors_digest(ENV, FILES),
            "fafi_authors_client": dataclasses.asdict(cfg),
            "train": [train.epochs, train.batch_size, train.lr, train.optimizer, train.momentum],
            "device": ctx.device.type, **initial_model_parts(ctx),
        }  # fmt: skip

        def make() -> Payload:
            initial = shared_initial_model(ctx)
            assert isinstance(initial, ClassifierModel)
            model, trace = authors_client_step(
                initial, ctx.data, ctx.task, train, cfg.epochs_per_call, ctx.seed, ctx.arch,
                ctx.client_id, ctx.device,
            )  # fmt: skip
            return model_fields(model).merged(Payload({}, trace.facts()))

        label = "FAFI model (authors' client step)"
        return client_artefact(ctx, "fafi_authors_client_model", parts, make, label)

    def trained(self, ctx: ClientContext) -> nn.Module:
        return model_from_fields(self._artefact(ctx), ctx.dims).eval()

    def client_facts(self, ctx: ClientContext) -> dict[str, float]:
        """What their step did (module docs), read from the cached step."""
        scalars = self._artefact(ctx).scalars
        return {k: float(v) for k, v in scalars.items() if k.startswith("authors_")}
