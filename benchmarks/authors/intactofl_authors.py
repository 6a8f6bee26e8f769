"""Plugin ``intactofl_authors``: IntactOFL with the authors' server step, unedited.

Clients are ``intactofl``'s (``SendsTrainedModel``: the same cached trained models, one per
client, any architecture). The server runs, from ``zenghui9977/IntactOFL`` (commit e8f86ef,
code under ``source/``):

* ``intactofl_server_process`` and ``intactofl_moe_train`` of
  ``oneshot_algorithms/oneshot_intactofl.py``: the MoE (their ``MoEEnsemble`` with a
  ``linear`` ``LinearGatingNetwork``, PyTorch's default initialisation, top-k of
  ``topk``·K experts), their ``Generator``, their ``IntactOFLSynthesizer`` (the generator
  re-initialised every epoch by their ``reset_model``, its noise optimised with it, Adam
  β₁ = 0.5, loss bn·BN-statistics/K (``DeepInversionHook`` on every expert's BatchNorm2d) +
  oh·CE(MoE) − adv·masked KL_T=3 between the plain ensemble and the MoE, the lowest-loss batch
  kept), the gate's SGD (momentum 0.9, ``weight_decay``, cosine over the epochs) on one pass
  over the pool per epoch, each batch perturbed by ODS (ε = ``odseta``) from the plain
  ensemble, on CE + ``alpha``·std(gate scores) + ``beta``·KL_T(ensemble ‖ MoE), gradients
  clipped at 10;
* from ``oneshot_algorithms/synthesizer_utils.py`` the classes and functions those use
  (``normalize``, ``Normalizer``, ``kldiv``, ``KLDiv``, ``DeepInversionHook``, ``Generator``,
  ``DataIter``, ``pack_images``, ``save_image_batch``, ``save_image_batch_labeled``,
  ``LabeledImageDataset``, ``_collect_all_images``, ``UnlabeledImageDataset``, ``ImagePool``,
  ``BaseSynthesis``, ``IntactOFLSynthesizer``, ``reset_model``, ``LinearGatingNetwork``,
  ``MoEEnsemble``); from ``oneshot_algorithms/utils.py`` ``test_acc`` and ``Ensemble``; from
  ``commona_libs.py`` ``save_yaml_config``.

Each is parsed out of its file and executed alone (:mod:`load`): their modules, with their
``visdom`` import, their logger set-up (a log file under the working directory) and their
``setup_seed(1)``, are never run. Their pool of generated images goes through their
``ImagePool``: PNG files (8-bit, clamped to [0, 1]) in a temporary folder, read back by their
DataLoaders (``num_workers=4``, ``pin_memory=True``, as written).

Adaptations, all outside their code:

* The experts: each of our clients' models behind their models' interface
  (``forward(x, get_feature=False)``; with ``get_feature=True`` their models return
  (logits, features)): :class:`TheirInterface` returns the logits, and the logits again in
  the features' place — their IntactOFL path discards those features (``t_feat``,
  ``oneshot_intactofl.py:31-33``). The models are otherwise untouched (in eval mode, with
  gradients enabled, as their local models arrive).
* The configuration their code reads from its YAML is built from this method's knobs
  (:func:`their_config`): the sizes are ``intactofl``'s knobs with ``intactofl``'s defaults
  (:class:`SynthesisBudget`: ``rounds`` → their ``epochs``, ``generator_steps`` →
  ``g_steps``, ``batch_size`` → ``synthesis_batch_size`` and ``batch_size``, ``noise_dim``
  → ``nz``, ``width`` → ``ngf``, ``generator_lr`` → ``lr_g``, ``learner_lr`` → ``gt_lr``);
  the rest default to their ``yaml_config/oneshot/cifar10_clients5_dir0.1.yaml``
  (``gating_arch: linear``, ``topk: 1.0``, ``adv``/``bn``/``oh`` 1, ``alpha`` 0.01, ``beta``
  1, ``odseta`` 8, ``kd_T`` 4, ``weight_decay`` 1e-4, ``his: True``, ``save_freq: 10``).
* The device: ``config['device']`` is the run's (their YAML says ``cuda:0``; every tensor
  they make is moved to it).
* The data statistics: their ``NORMALIZE_DICT`` (``dataset_helper.py``, not loaded) is
  replaced by one entry, the run's dataset name → our statistics of it (the same as theirs
  for Fashion-MNIST and MNIST). The transform their ``ImagePool`` reads the PNGs back with,
  their train set's (``trainset.transform``), is what their ``load_dataset`` builds for
  every dataset it knows but Tiny-ImageNet: ``ToTensor`` then ``Normalize`` — with our
  statistics.
* The test split: their loop cannot run without one (``oneshot_intactofl.py:62-63`` and
  ``:115`` evaluate on it), and the server holds none in oneshotfl, so it is handed the
  dataset's test split (reloaded by name: the split the run evaluates on, unless the run had
  a ``data_root`` outside ``$ONESHOTFL_DATA`` or a ``feature_skew``), in a DataLoader as
  their ``algo_main.py:105`` builds it (batch 256, shuffled); ``test_examples`` > 0 hands
  them a fixed subset instead, to save their per-epoch evaluations' time. It feeds their
  logged figures only: the outcome is the final MoE, evaluated by the run like every method.
* Global state: their code draws from torch's global generator (the gate's and generator's
  initialisation, the noise, labels and ODS directions, the loaders' shuffles); it runs
  inside a fork of it seeded from the run's seed, restored afterwards (their ``setup_seed``
  is not run). Their ``logger`` is a private logger whose lines are kept, their progress
  bar's and any other output go to a buffer that is discarded, and the results YAML and the
  pool's PNGs they write go to a temporary folder, removed afterwards. PyTorch's warnings
  that ``pin_memory`` has no accelerator to pin for (on a CPU) and that their four loader
  workers exceed the cores it suggests (on a small machine) are silenced; the loaders run
  as written.
* Recording, without changing what runs: ``test_acc`` is wrapped where their
  ``oneshot_intactofl.py`` calls it, to keep each accuracy, the model it scored and its
  time; their ``Generator`` and ``DeepInversionHook`` are subclassed where they are used only
  to keep the instances made. After the run the hooks are removed with their own
  ``DeepInversionHook.remove`` (their code never removes them, so every later forward pass
  of an expert would recompute its BatchNorm statistics) and the experts' gradients, which
  their losses accumulate and nothing reads, are dropped.
* The outcome: ``intactofl_server_process`` returns the plain ensemble (below), not the MoE
  it trains, so the MoE is the model their ``test_acc`` scored at every epoch: their
  ``MoEEnsemble`` after the last epoch, wrapped as one module (:class:`TheirMoE`; their class
  keeps the experts in a plain list) and evaluated by the run.

What their code reports (``oneshot_intactofl.py``): ``intactofl_server_process`` replaces the
student it is given by ``Ensemble(model_list)`` (``:59``; ``utils.py:372-396``: the uniform
mean of the experts' logits), logs the untrained MoE's and that ensemble's accuracy
(``:62-65``), scores the MoE on the test split after every epoch (``:115``), keeps the best of
those (``:120-122``), and returns the plain ensemble with that best (``:131``).
``OneShotIntactOFL`` then scores what it got back — the plain ensemble — logs it as
``Test Acc`` (``:198-200``) and saves it under the method's name, beside ``best_acc``
(``:203-207``). So the number the repository prints as IntactOFL's is the plain logit
ensemble's (our ``ensemble:combine=logits``), and the other number it saves is the MoE's best
epoch selected on the test set; neither is the trained MoE's final accuracy.

Diagnostics: ``authors_printed_accuracy`` (their ``test_acc`` of the model
``intactofl_server_process`` returns, as ``:198`` computes what ``:200`` prints),
``authors_best_accuracy_selected_on_test`` (their ``best_acc``) and its epoch
``authors_best_epoch`` (1-based), ``authors_final_moe_accuracy`` (their last epoch's score
of the MoE: the outcome, as their ``test_acc`` scores it), ``authors_moe_accuracy`` (every
epoch's), ``authors_initial_moe_accuracy`` and ``authors_initial_ensemble_accuracy`` (the
lines ``:64-65`` log), ``authors_log`` (the lines their logger printed, paths left out),
``authors_test_seconds`` (the time of their test evaluations, part of ``server_seconds``:
work ``intactofl`` does not do), and ``intactofl``'s cost figures.

Needs ``INTACTOFL_REPO`` = a checkout of that repository (the folder holding ``source/``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import transforms
from tqdm import trange

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_definitions
from load import test_split as shared_test_split

from oneshotfl.encoders.cost import forward_flops, trainable_parameters
from oneshotfl.extend import (
    GlobalModel,
    LabelledData,
    Outcome,
    Payload,
    SendsTrainedModel,
    ServerContext,
    TaskInfo,
    client_models,
    register_method,
    require,
)
from oneshotfl.methods.intactofl import IntactOFL
from oneshotfl.models.generator import input_statistics
from oneshotfl.params import is_int, is_number
from oneshotfl.seeding import derive_seed
from oneshotfl.training.synthesis import SynthesisBudget

ENV = "INTACTOFL_REPO"
COMMON_FILE = "source/commona_libs.py"
UTILS_FILE = "source/oneshot_algorithms/utils.py"
SYNTH_FILE = "source/oneshot_algorithms/synthesizer_utils.py"
ALGO_FILE = "source/oneshot_algorithms/oneshot_intactofl.py"
SYNTH_NAMES = (
    "normalize",
    "Normalizer",
    "kldiv",
    "KLDiv",
    "Generator",
    "DataIter",
    "pack_images",
    "save_image_batch",
    "save_image_batch_labeled",
    "LabeledImageDataset",
    "_collect_all_images",
    "UnlabeledImageDataset",
    "ImagePool",
    "BaseSynthesis",
    "IntactOFLSynthesizer",
    "reset_model",
    "LinearGatingNetwork",
    "MoEEnsemble",
)
"""What their server step uses of ``synthesizer_utils.py`` (``DeepInversionHook`` apart)."""
TEST_BATCH = 256
"""Their ``test_batch_size`` (``yaml_config/oneshot/cifar10_clients5_dir0.1.yaml``)."""


@dataclass(frozen=True)
class IntactOFLAuthorsConfig(SynthesisBudget):
    """``intactofl``'s sizes (:class:`SynthesisBudget`, the same defaults) and the rest of
    their YAML's ``intactofl`` section, named as there (see the module docs).

    Attributes:
        topk: the experts the gate keeps per sample, as a fraction of K (theirs: 1.0).
        alpha: weight of the gate scores' std in the gate loss.
        beta: weight of the KL to the plain ensemble in the gate loss.
        odseta: ODS step on the gate's batches (normalised units).
        kd_t: temperature of that KL (their ``kd_T``).
        adv: weight of the generator's adversarial term.
        bn: weight of the generator's BatchNorm-statistics term.
        oh: weight of the generator's cross-entropy term.
        weight_decay: the gate's SGD weight decay.
        test_examples: how many test examples their loop scores its models on (0: the
            whole split, as theirs; else a fixed subset of that many, the same for every
            run): a budget knob, since their per-epoch evaluations of every expert dominate
            their time on a CPU. It changes their logged figures only, never the outcome or
            its evaluation.
    """

    topk: float = 1.0
    alpha: float = 0.01
    beta: float = 1.0
    odseta: float = 8.0
    kd_t: float = 4.0
    adv: float = 1.0
    bn: float = 1.0
    oh: float = 1.0
    weight_decay: float = 1e-4
    test_examples: int = 0

    def validate(self) -> None:
        super().validate()
        ok = is_number(self.topk) and 0 < self.topk <= 1
        require(ok, "topk", "a fraction of the experts in (0, 1]", self.topk)
        require(is_number(self.kd_t) and self.kd_t > 0, "kd_t", "> 0", self.kd_t)
        n = self.test_examples
        require(is_int(n, 0), "test_examples", "an int >= 0 (0: the whole split)", n)
        for name in ("alpha", "beta", "odseta", "adv", "bn", "oh", "weight_decay"):
            value = getattr(self, name)
            require(is_number(value) and value >= 0, name, ">= 0", value)


def their_config(
    cfg: IntactOFLAuthorsConfig, task: TaskInfo, device: torch.device
) -> dict[str, Any]:
    """The configuration their ``intactofl_server_process`` reads, from ``cfg``."""
    return {
        "device": device,
        "dataset": {
            "data_name": task.dataset,
            "channels": task.in_channels,
            "image_size": task.image_size,
            "num_classes": task.num_classes,
        },
        "checkpoint": {"save_freq": 10},
        "intactofl": {
            "gating_arch": "linear",
            "topk": cfg.topk,
            "nz": cfg.noise_dim,
            "ngf": cfg.width,
            "g_steps": cfg.generator_steps,
            "lr_g": cfg.generator_lr,
            "synthesis_batch_size": cfg.batch_size,
            "batch_size": cfg.batch_size,
            "adv": cfg.adv,
            "bn": cfg.bn,
            "oh": cfg.oh,
            "his": True,
            "batchonly": False,
            "batchused": False,
            "epochs": cfg.rounds,
            "gt_lr": cfg.learner_lr,
            "weight_decay": cfg.weight_decay,
            "alpha": cfg.alpha,
            "beta": cfg.beta,
            "odseta": cfg.odseta,
            "kd_T": cfg.kd_t,
        },
    }


class TheirInterface(nn.Module):
    """One of our client models behind their models' ``forward(x, get_feature=False)``: the
    logits, or (logits, logits) for their (logits, features) — see the module docs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, x: torch.Tensor, get_feature: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logits: torch.Tensor = self.model(x)
        return (logits, logits) if get_feature else logits


class TheirMoE(nn.Module):
    """Their trained ``MoEEnsemble`` as one model: its gate a submodule (inside it) and its
    experts, which their class keeps in a plain list, in a ``ModuleList``, so that ``.to``,
    ``.eval`` and ``.parameters`` reach both; the forward pass is theirs."""

    def __init__(self, moe: nn.Module, experts: Sequence[nn.Module]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.moe(x)
        return out


@dataclass
class Scored:
    """One call of their ``test_acc``: the model, its accuracy and the call's seconds."""

    model: nn.Module
    accuracy: float
    seconds: float


@dataclass
class Record:
    """What the recording wrappers saw during one run of their server step."""

    tests: list[Scored] = field(default_factory=list)
    hooks: list[Any] = field(default_factory=list)
    generators: list[nn.Module] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


class _Lines(logging.Handler):
    """Keeps each logged message in ``lines``."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def recording(cls: Any, sink: list[Any]) -> type:
    """A subclass of ``cls`` that only appends every instance it makes to ``sink`` (their
    class is left as it is: the name is replaced only where it is used)."""

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        sink.append(self)

    return type(cls.__name__, (cls,), {"__init__": init})


def authors_code(record: Record, task: TaskInfo) -> dict[str, Any]:
    """Their ``intactofl_server_process``, ``test_acc``, ``Ensemble`` and ``MoEEnsemble``,
    loaded from ``$INTACTOFL_REPO`` for one run, the recording wrappers and the private
    logger reporting to ``record``."""
    logger = logging.Logger("intactofl_authors")  # unregistered: no parent, no propagation
    logger.setLevel(logging.INFO)
    logger.addHandler(_Lines(record.log))
    common = authors_definitions(
        ENV, COMMON_FILE, ("save_yaml_config",), {"yaml": yaml, "logger": logger}
    )
    utils = authors_definitions(ENV, UTILS_FILE, ("test_acc", "Ensemble"), {"torch": torch})
    hook = authors_definitions(ENV, SYNTH_FILE, ("DeepInversionHook",), {"torch": torch})
    scope: dict[str, Any] = {"torch": torch, "os": os, "np": np, "math": math, "Image": Image}
    scope.update(ABC=ABC, abstractmethod=abstractmethod, Dict=dict)  # their typing.Dict
    scope["DeepInversionHook"] = recording(hook["DeepInversionHook"], record.hooks)
    synth = authors_definitions(ENV, SYNTH_FILE, SYNTH_NAMES, scope)
    their_test_acc = utils["test_acc"]

    def test_acc(model: nn.Module, testloader: Any, device: Any = "cpu") -> float:
        start = time.perf_counter()
        acc = float(their_test_acc(model, testloader, device))
        record.tests.append(Scored(model, acc, time.perf_counter() - start))
        return acc

    stats = input_statistics(task)
    algo_scope: dict[str, Any] = {"torch": torch, "os": os, "copy": copy, "trange": trange}
    algo_scope.update(logger=logger, save_yaml_config=common["save_yaml_config"])
    algo_scope.update(test_acc=test_acc, Ensemble=utils["Ensemble"])
    algo_scope["NORMALIZE_DICT"] = {task.dataset: {"mean": stats.mean, "std": stats.std}}
    algo_scope["Generator"] = recording(synth["Generator"], record.generators)
    for name in ("KLDiv", "IntactOFLSynthesizer", "Normalizer", "MoEEnsemble"):
        algo_scope[name] = synth[name]
    names = ("intactofl_moe_train", "intactofl_server_process")
    algo = authors_definitions(ENV, ALGO_FILE, names, algo_scope)
    return {
        "intactofl_server_process": algo["intactofl_server_process"],
        "test_acc": their_test_acc,
        "Ensemble": utils["Ensemble"],
        "MoEEnsemble": synth["MoEEnsemble"],
    }


def test_split(task: TaskInfo) -> LabelledData:
    """The dataset's test split, loaded once per process (see the module docs)."""
    split: LabelledData = shared_test_split(task, "intactofl_authors")
    return split


def scored_subset(test: LabelledData, n: int) -> LabelledData:
    """``n`` examples of ``test`` drawn once by a fixed permutation (all of it for 0 or
    ``n`` at least its size)."""
    if n == 0 or n >= len(test.y):
        return test
    kept = torch.randperm(len(test.y), generator=torch.Generator().manual_seed(0))[:n]
    return LabelledData(test.x[kept], test.y[kept])


@contextlib.contextmanager
def global_rng_seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Torch's global generators (CPU and ``device``) seeded with ``seed`` inside the block,
    restored on exit."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True)
class AuthorsRun:
    """One run of their server step: the trained MoE and what their code scored and
    reported (see the module docs)."""

    moe: nn.Module
    gate: nn.Module
    printed: float
    best: float
    moe_accuracy: list[float]
    initial_ensemble: float
    pool_size: int
    generator_parameters: int
    bn_layers: int
    seconds: float
    test_seconds: float
    log: list[str]


def authors_server_step(
    experts: list[nn.Module],
    test: LabelledData,
    cfg: IntactOFLAuthorsConfig,
    task: TaskInfo,
    seed: int,
    device: torch.device,
) -> AuthorsRun:
    """Their ``intactofl_server_process`` on ``experts`` (see the module docs)."""
    record = Record()
    code = authors_code(record, task)
    server_process: Callable[..., tuple[nn.Module, float]] = code["intactofl_server_process"]
    stats = input_statistics(task)
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(stats.mean, stats.std)]
    )
    wrapped = [TheirInterface(m) for m in experts]
    quiet = io.StringIO()
    with (
        global_rng_seeded(seed, device),
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
        warnings.catch_warnings(),
        tempfile.TemporaryDirectory() as tmp,
    ):
        for message in (".*pin_memory.*", ".*worker processes in total.*"):
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        loader = DataLoader(TensorDataset(test.x, test.y), batch_size=TEST_BATCH, shuffle=True)
        start = time.perf_counter()
        returned, best = server_process(
            config=their_config(cfg, task, device),
            model_list=wrapped,
            student_model=None,  # replaced at their :59 before any use
            test_loader=loader,
            save_dir=tmp,
            methods_transform=transform,
        )
        seconds = time.perf_counter() - start
        printed = float(code["test_acc"](returned, loader, device))  # their :198
        pool = sum(f.endswith(".png") for _, _, files in os.walk(tmp) for f in files)
    for hook in record.hooks:
        hook.remove()
    moes = [s for s in record.tests if isinstance(s.model, code["MoEEnsemble"])]
    ensembles = [s for s in record.tests if isinstance(s.model, code["Ensemble"])]
    if len(moes) != cfg.rounds + 1 or len(ensembles) != 1 or len(record.generators) != 1:
        raise RuntimeError(
            f"intactofl_authors: expected their code to score the MoE {cfg.rounds + 1} times, "
            f"the ensemble once and to build one generator, got {len(moes)}, "
            f"{len(ensembles)} and {len(record.generators)}"
        )
    moe = TheirMoE(moes[0].model, wrapped)
    moe.zero_grad(set_to_none=True)
    return AuthorsRun(
        moe=moe.eval(),
        gate=moes[0].model.get_submodule("gating_network"),
        printed=printed,
        best=float(best),
        moe_accuracy=[s.accuracy for s in moes],
        initial_ensemble=ensembles[0].accuracy,
        pool_size=pool,
        generator_parameters=trainable_parameters(record.generators[0]),
        bn_layers=len(record.hooks),
        seconds=seconds,
        test_seconds=sum(s.seconds for s in record.tests),
        log=[line for line in record.log if not line.startswith("Save config to")],
    )


@register_method("intactofl_authors", "IntactOFL, the authors' server step (plugin)")
class IntactOFLAuthors(SendsTrainedModel[IntactOFLAuthorsConfig]):
    """``intactofl``'s clients; the authors' generator, MoE gate and training loop."""

    Config = IntactOFLAuthorsConfig
    cost = IntactOFL.cost
    known_limits = IntactOFL.known_limits
    requires = IntactOFL.requires

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        cfg, task = self.config, ctx.task
        experts = client_models(payloads, ctx.dims, device=ctx.device)
        k = len(experts)
        require(int(cfg.topk * k) >= 1, "topk", f">= 1/{k} (one of the {k} experts)", cfg.topk)
        seed = derive_seed(ctx.seed, "intactofl_authors")
        test = scored_subset(test_split(task), cfg.test_examples)
        run = authors_server_step(experts, test, cfg, task, seed, ctx.device)
        gate = run.gate
        shape = (task.in_channels, task.image_size, task.image_size)
        probe = torch.zeros(1, *shape, device=ctx.device)
        # epochs where the MoE's accuracy reached their best_acc (the first, 1-based)
        best_epoch = 1 + run.moe_accuracy[1:].index(max(run.moe_accuracy[1:]))
        info = {
            "experts": k,
            "bn_layers": run.bn_layers,
            "parameters": sum(p.numel() for p in run.moe.parameters()),
            "gate_parameters": trainable_parameters(gate),
            "generator_parameters": run.generator_parameters,
            "trainable_server_parameters": trainable_parameters(gate) + run.generator_parameters,
            "flops_per_image": forward_flops(run.moe, probe),
            "pool_size": run.pool_size,
            "authors_printed_accuracy": run.printed,
            "authors_best_accuracy_selected_on_test": run.best,
            "authors_best_epoch": float(best_epoch),
            "authors_final_moe_accuracy": run.moe_accuracy[-1],
            "authors_moe_accuracy": run.moe_accuracy[1:],
            "authors_initial_moe_accuracy": run.moe_accuracy[0],
            "authors_initial_ensemble_accuracy": run.initial_ensemble,
            "authors_log": run.log,
            "authors_test_seconds": run.test_seconds,
            "timings": {"server_seconds": run.seconds},  # measured: never compared
        }
        return GlobalModel(run.moe, info)
