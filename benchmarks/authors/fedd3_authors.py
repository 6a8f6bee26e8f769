"""Plugin ``fedd3_authors``: FedD3 with the authors' server step, unedited.

Clients are ``fedd3``'s (the same cached distilled images and labels: KIP by default). The
server runs, from ``rruisong/FedD3`` (commit e92be11):

* the class ``FedServer`` of ``fedd3/fedd3_server.py`` — ``__init__``, ``load_distill``,
  ``load_test`` and ``train``: their DataLoaders (``shuffle=True``, batch ``server_batch``),
  ``Adam(lr=server_lr, weight_decay=1e-4)``, cross-entropy, ``server_epochs`` epochs, the
  model never switched to ``eval()``, and after every epoch their accuracy on the test split
  recorded by their ``Recorder`` (``postprocessing/recorder.py``), whose running maximum their
  progress bar shows as "Max Acc" — with the constant ``json_types`` and the class
  ``PythonObjectEncoder`` of the same file, which ``train`` uses to write the record;
* the class ``LeNet`` of ``utils/models.py``, only because ``FedServer.__init__`` builds the
  model named by ``model_name`` (``"LeNet"``); it is replaced before training (below).

Each is parsed out of its file and executed alone (the modules themselves, with their imports
of torchvision and matplotlib, are never run).

Adaptations, all outside their code:

* The model: ``train`` trains whatever module ``server.model`` holds, so after their
  constructor we put there the federation's architecture (``union_arch``, as ``fedd3``) from
  the run's shared initialisation — the model ``fedd3`` starts from. Their ``LeNet`` is not
  ours: on 28x28 inputs both are conv 5x5 (6) → max-pool → conv 5x5 (16) → max-pool →
  FC 400 → 120 → 84 → C with the same parameter shapes (61,706 for 10 classes), but their
  second convolution is unpadded (14x14 → 10x10, pooled to 5x5) where ours is "same"-padded
  (14x14 → 14x14, pooled to 7x7, then average-pooled to 5x5), and theirs has a fixed
  16·5·5 input (it cannot take 8x8 digits). ``dataset_id`` is the dataset's name in their
  list (``MNIST`` for one outside it: it only sizes their discarded ``LeNet``).
* The device: ``server._device`` is set to the run's device (theirs takes ``cuda:0`` when
  there is one).
* The seed: ``train(i_seed=...)`` seeds the global torch and NumPy generators (their
  ``main()`` leaves it at its default 0); we pass the run's model seed, inside a fork of the
  global generators, which are restored afterwards. Their shuffles therefore differ from
  ``fedd3``'s (its own generator); the data, initial model and optimiser are the same.
* ``train`` writes its record as JSON to ``res_root/exp_dir``: a temporary folder here. Their
  print and tqdm progress bar go to a buffer that is discarded.
* The test split: the server holds no test data in oneshotfl, but their loop cannot run
  without it — ``train`` builds its test loader from ``load_test``'s data before the first
  epoch (``fedd3_server.py:168-174``), and the ``test_on_gpu=False`` branch that would skip
  the evaluation raises a ``TypeError`` (``:219``: ``'Epoch: %d', epoch + '| Train loss…'``
  adds an int to a str). So the
  server is given the dataset's test split (reloaded by name with ``load_dataset``: the same
  split the run evaluates on, unless the run had a ``data_root`` outside ``$ONESHOTFL_DATA``
  or a ``feature_skew``, whose test split is mixed). It feeds their logged figures only:
  the outcome is the **final epoch's model** (in eval mode; ``cnn`` has neither BatchNorm
  nor dropout, so the mode changes nothing), evaluated by the run like every method.

Diagnostics: ``authors_final_test_accuracy`` (their last logged accuracy: the final model,
as our evaluation scores it), ``authors_max_test_accuracy_selected_on_test`` (their "Max
Acc": the best epoch, chosen on the test split — not a held-out figure) and its epoch
``authors_max_test_accuracy_epoch`` (1-based), ``authors_final_train_loss`` (their last
batch's loss). ``server_weight_decay`` must stay 1e-4 (hard-coded in their ``train``).

Needs ``FEDD3_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from json import JSONEncoder
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions, authors_digest
from load import test_split as shared_test_split

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import initial_model_parts, shared_initial_model, union_arch
from oneshotfl.methods.fedd3 import FedD3, FedD3Config, received_examples
from oneshotfl.params import require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.outcome import GlobalModel, Outcome

ENV = "FEDD3_REPO"
SERVER_FILE = "fedd3/fedd3_server.py"
MODELS_FILE = "utils/models.py"
RECORDER_FILE = "postprocessing/recorder.py"
THEIR_DATASETS = {
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
    "cifar10": "CIFAR10",
    "svhn": "SVHN",
    "cifar100": "CIFAR100",
}
"""Our dataset names → their ``dataset_id`` (anything else: ``MNIST``, see the module docs)."""
CACHE_VERSION = 1


def authors_code() -> dict[str, Any]:
    """Their ``FedServer`` (with ``LeNet``, ``Recorder``, ``PythonObjectEncoder`` and
    ``json_types`` in its scope), loaded from ``$FEDD3_REPO``."""
    lenet = authors_definitions(ENV, MODELS_FILE, ("LeNet",), {"nn": nn, "F": F, "torch": torch})
    recorder = authors_definitions(ENV, RECORDER_FILE, ("Recorder",), {"np": np, "json": json})
    scope: dict[str, Any] = {"os": os, "json": json, "pickle": pickle, "torch": torch}
    scope.update(np=np, nn=nn, F=F, DataLoader=DataLoader, TensorDataset=TensorDataset)
    scope.update(tqdm=tqdm, deepcopy=copy.deepcopy, JSONEncoder=JSONEncoder, **lenet, **recorder)
    names = ("json_types", "PythonObjectEncoder", "FedServer")
    return authors_definitions(ENV, SERVER_FILE, names, scope)


def test_split(task: TaskInfo) -> LabelledData:
    """The dataset's test split, loaded once per process (see the module docs)."""
    split: LabelledData = shared_test_split(task, "fedd3_authors")
    return split


@contextlib.contextmanager
def global_rng_kept(device: torch.device) -> Any:
    """The global torch (CPU and ``device``) and NumPy generators restored on exit."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    state = np.random.get_state()
    with torch.random.fork_rng(devices=cuda):
        yield
    np.random.set_state(state)


def authors_train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    test: LabelledData,
    cfg: FedD3Config,
    dataset: str,
    seed: int,
    device: torch.device,
) -> tuple[nn.Module, list[float], list[float]]:
    """``model`` trained by their ``FedServer.train`` on (``x``, ``y``): (the final model,
    their per-epoch test accuracies, their per-epoch last-batch losses)."""
    server_cls = authors_code()["FedServer"]
    quiet = io.StringIO()
    with (
        global_rng_kept(device),
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
        tempfile.TemporaryDirectory() as tmp,
    ):
        server = server_cls(
            epoch=cfg.server_epochs,
            batch_size=cfg.server_batch,
            lr=cfg.server_lr,
            momentum=0.9,  # unused by their Adam
            num_workers=0,  # unused
            dataset_id=THEIR_DATASETS.get(dataset, "MNIST"),
            server_id="server",
            model_name="LeNet",
            i_seed=seed,
            test_on_gpu=True,
        )
        server.model = model  # ours, from the shared initialisation (module docs)
        server._device = device
        server.load_test({"x": test.x, "y": test.y})
        server.load_distill({"x": x, "y": y})
        server.train("server.json", res_root=tmp, i_seed=seed)
    record = server.recorder.res["server"]
    accuracies = [float(a) for a in record["iid_accuracy"]]
    losses = [float(v) for v in record["train_loss"]]
    return server.model, accuracies, losses


@dataclass(frozen=True)
class FedD3AuthorsConfig(FedD3Config):
    """``fedd3``'s; ``server_weight_decay`` fixed at the 1e-4 their ``train`` hard-codes."""

    def validate(self) -> None:
        super().validate()
        require(
            self.server_weight_decay == 1e-4,
            "server_weight_decay",
            "1e-4 (hard-coded in the authors' FedServer.train)",
            self.server_weight_decay,
        )


@register_method("fedd3_authors", "FedD3, the authors' server training step (plugin)")
class FedD3Authors(FedD3):
    """``fedd3``'s clients; the authors' ``FedServer.train`` on the union on the server."""

    Config = FedD3AuthorsConfig
    config: FedD3AuthorsConfig

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg = self.config
        arch = union_arch(ctx, "fedd3_authors", cfg.arch)
        x, y = received_examples(payloads)
        test = test_split(ctx.task)

        def make() -> Payload:
            model = shared_initial_model(ctx, arch)
            trained, accuracies, losses = authors_train(
                model, x, y, test, cfg, ctx.task.dataset, ctx.seed, ctx.device
            )
            curves = {
                "authors.test_accuracy": np.asarray(accuracies, np.float64),
                "authors.train_loss": np.asarray(losses, np.float64),
            }
            return model_fields(trained.cpu()).merged(Payload(curves))

        parts = {
            "version": CACHE_VERSION,
            "authors": authors_digest(ENV, (SERVER_FILE, MODELS_FILE)),
            "data": hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest(),
            "test": hashlib.sha256(test.x.numpy().tobytes() + test.y.numpy().tobytes()).hexdigest(),
            "train": [cfg.server_epochs, cfg.server_batch, cfg.server_lr],
            "device": ctx.device.type,
            **initial_model_parts(ctx, arch),
        }
        made, _ = ctx.store.get_or_make("fedd3_authors_server", parts, make, "fedd3_authors model")
        model = model_from_fields(made, ctx.dims)
        accuracies = made.arrays["authors.test_accuracy"]
        best = int(np.argmax(accuracies))
        info = {
            "examples": float(len(x)),
            "authors_final_test_accuracy": float(accuracies[-1]),
            "authors_max_test_accuracy_selected_on_test": float(accuracies[best]),
            "authors_max_test_accuracy_epoch": float(best + 1),
            "authors_final_train_loss": float(made.arrays["authors.train_loss"][-1]),
        }
        return GlobalModel(model.eval(), info)
