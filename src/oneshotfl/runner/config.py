"""The experiment configuration: one frozen dataclass, from the CLI or a YAML file.

YAML keys are the field names (``local_epochs`` or ``local-epochs``); ``key=value``
overrides apply on top. ``methods`` is a list of method specs (``name`` or
``name:key=value:...``, or in YAML a mapping ``{name: ensemble, weighting: size}``).
``model`` picks client architectures: one name, a list cycled over clients
(``cnn,resnet8``), or a per-client mapping (``0=resnet8,1=mlp,*=cnn``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from oneshotfl.data.datasets import DATASETS
from oneshotfl.data.partition import Partitioner, make_partitioner
from oneshotfl.data.user import UserDataError, is_user_spec, parse_user_spec
from oneshotfl.devices import DEVICE_CHOICES
from oneshotfl.models.base import Init
from oneshotfl.params import Params, coerce_params
from oneshotfl.plugins import PluginError, load_plugins
from oneshotfl.registry import did_you_mean
from oneshotfl.runner.config_values import (
    NAMES_CHECKED,
    ConfigError,
    check_bounds,
    client_architectures,
    flatten_sections,
    names_unchecked,
    normalise_methods,
    normalise_model,
    normalise_plugins,
    parse_overrides,
    read_config_file,
)
from oneshotfl.security.threats import AttackError, build_attacks
from oneshotfl.training.loop import TrainConfig


@dataclass(frozen=True)
class ExperimentConfig(Params):
    """Everything that determines one federated run.

    Attributes:
        methods: method specs to run on the same federation (they share client artefacts).
        method_defaults: knob values that become a method's defaults in this run, as method
            specs (``fedeov:fgsm_steps=15``), beneath what each spec in ``methods`` sets; the
            keys results use stay the specs as written. A committed benchmark pins so the
            defaults it was recorded with when a later version changes them.
        plugins: modules (or .py files) imported before any name is resolved, which register
            your own methods, models, datasets, … (see :mod:`oneshotfl.plugins`); carried to
            every Flower node and worker process.
        dataset: dataset registry name, or a user dataset ``folder:path=DIR``,
            ``npz:path=FILE`` or ``csv:path=FILE`` (their options: ``oneshotfl.data.user``).
        data_root: where the dataset lies (else ``$ONESHOTFL_DATA`` and system paths).
        download: let torchvision download the dataset (needs a network).
        max_train: keep a seeded random subset of this many training examples (tiny runs).
        public_size: examples carved from train as the unlabelled public pool (0 = none).
        val_fraction: fraction of each client's data held out as its validation split.
        max_client_examples: ``N_max``: the most examples one client may hold and report
            (train + validation); 0: the federation's own pool (the clients' examples together).
            Set it where nodes bring their own data, which the server cannot count.
        partition: partitioner registry name, or a Flower Datasets partitioner
            ``flwr:ClassName[:key=value...]`` (the flwr-datasets extra).
        alpha: Dirichlet concentration (``dirichlet``, ``dirichlet_client``).
        classes_per_client: ``#C`` of the ``pathological`` partitioner (the dominant classes of
            ``skew``).
        psi: ψ of the ``skew`` partitioner: the fraction of a client's data from its
            dominant classes (FOL).
        min_samples: least examples per client (Dirichlet partitioners).
        clients: number of clients.
        feature_skew: a per-client input transform (``color``, ``rotation:max_degrees=90``,
            ``noise:max_std=1``; see :mod:`oneshotfl.data.feature_skew`), or None.
        malicious: how many clients (ids 0 … m−1) follow ``attack`` (robustness studies;
            0: nobody attacks, whatever ``attack`` says).
        attack: what the malicious clients do: ``label_flip``, ``scale:factor=10``,
            ``noise:std=1``, ``wrong_predictions``, ``over_report``, or one the wire refuses:
            ``garbage``, ``oversize``, ``wrong_arch`` (``oneshotfl list attacks``; see
            :mod:`oneshotfl.security.threats`); several joined by ``+`` are dealt out in turn.
        model: client architectures: one name, a list cycled over clients (cnn,resnet8) or a
            per-client mapping (0=resnet8,*=cnn).
        server_model: server architecture for methods that train a server model.
        encoder: the shared frozen encoder of encoder-based methods (FedAGE), an encoder spec
            such as ``random:dim=64`` or ``torchvision:arch=resnet18:weights=PATH``.
        graph: the neighbour graph of peer (server-free) methods: ``complete``,
            ``ring:k=K``, ``random:degree=D`` or ``file:path=F`` (drawn with the partition
            seed, on the simulation or the ServerApp, and only when a peer method runs).
        local_epochs: client training epochs.
        local_steps: a floor in optimiser steps for every client training (and centralised
            training on their union): a client trains the fewest whole epochs, at least
            ``local_epochs``, that make this many steps over its data, so small datasets and
            small clients train as far as large ones; 0: exactly ``local_epochs``.
        local_floor_epochs: the most epochs the ``local_steps`` floor may raise a client's
            training to (0: no bound). It bounds what the floor costs by this many passes
            over the data, whatever the number of clients: without it, a client holding 60
            examples trains 300 epochs, so a fixed dataset split over more clients trains
            longer.
        client_batch: clients trained together (same architecture and settings, a plain
            recipe) with stacked parameters and one vectorised step
            (:mod:`oneshotfl.training.vectorised`); 1: one client after another, today's
            loop. Equal in distribution to 1, not bit-identical; on a GPU or with many small
            clients, far faster.
        diagnostic_examples: the test examples each client's own model is checked on for
            the result file's ``local_test_accuracy`` (a seeded, class-stratified sample, the
            same for every client); 0: the whole test split; None: 50,000 examples spread
            over the clients, at least 20 and at most 1,000 each (10 clients: 1,000; 1,000
            clients: 50), so that this diagnostic, which no method asks for, costs about as
            much at any client count. Every outcome's accuracy stays exact.
        init: weight initialisation of the architectures without normalisation layers
            (``cnn``, ``fedavg_cnn``, ``mlp``, the ``head_mlp`` heads): ``he`` (He et al.
            2015; trains within small budgets) or ``torch`` (PyTorch's layer defaults, whose
            signal fades through depth; the committed benchmarks before 0.2 ran with it).
        batch_size: client training batch size.
        lr: client learning rate.
        optimizer: client optimiser.
        momentum: SGD momentum (clients and server).
        weight_decay: L2 penalty (clients and server).
        grad_clip: clip each optimiser step's gradients to this global L2 norm (clients and
            server; 0: no clipping) — what a table's features or a high learning rate need
            to train stably.
        server_epochs: server training epochs (distillation, pseudo-labels, synthesis).
        server_steps: a floor in optimiser steps for server training over the public pool:
            the server's epochs are raised to the fewest that make this many steps over the
            pool, so a small pool trains as far as a large one; 0: exactly
            ``server_epochs``. Data-free methods (no pool) train ``server_epochs``.
        server_batch_size: server training batch size.
        server_lr: server learning rate.
        server_optimizer: server optimiser.
        seed: model/training seed root.
        partition_seed: data-split seed root (none: the same as ``seed``).
        min_clients: fewest valid payloads a method needs: at the server (star), or clients
            whose message arrived and no receiver refused (peer).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        workers: worker processes at once (0: one per core, at most one per client; 1 on a
            GPU) that run the client steps; execution only — results are identical for every
            value.
        memo_mb: MB of client artefacts kept: the trained models and embeddings a run keeps
            in memory for its later methods, over every client (the least recently used
            client's dropped past it; the disk cache keeps them, else they are made again: the
            same bits, more time); 0: no bound. Execution only.
        hold_payloads: hold payloads, no folding; every payload of a round is handed to
            ``aggregate`` together. By default a method whose server step is a sum over
            clients folds each as it arrives (:meth:`~oneshotfl.protocol.contract.Method.fold`),
            so n payloads are never held at once. Execution only — the two paths give the
            same bits.
        client_threads: torch threads of every client step (training, a peer's receipt),
            in and out of the worker processes, so a run's result does not depend on
            ``workers``; None: the process's own threads (results of 0.1 were recorded so).
        server_threads: torch threads of the server side (aggregation, server training,
            evaluation), so a result does not depend on the core count either; None: the
            process's own threads (every result before 0.2 ran so).
        cache_dir: artefact cache directory (``None`` or "" disables the disk cache).
        group: a sweep group's name (see :mod:`oneshotfl.runner.sweep`): runs of different
            groups are one setting in reports even when their federations differ.
    """

    methods: tuple[str, ...] = ("local", "fedavg", "ensemble", "centralized")
    method_defaults: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    dataset: str = "fashion_mnist"
    data_root: str | None = None
    download: bool = False
    max_train: int | None = None
    public_size: int = 0
    val_fraction: float = 0.0
    max_client_examples: int = 0
    partition: str = "dirichlet"
    alpha: float = 0.5
    classes_per_client: int = 2
    psi: float = 0.7
    min_samples: int = 10
    clients: int = 10
    feature_skew: str | None = None
    malicious: int = 0
    attack: str | None = None
    model: str = "cnn"
    server_model: str | None = None
    encoder: str | None = None
    graph: str = "complete"
    local_epochs: int = 5
    local_steps: int = 300
    local_floor_epochs: int = 50
    client_batch: int = 1
    diagnostic_examples: int | None = None
    init: Init = "he"
    batch_size: int = 64
    lr: float = 0.01
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    grad_clip: float = 0.0
    server_epochs: int = 10
    server_steps: int = 300
    server_batch_size: int = 128
    server_lr: float = 0.001
    server_optimizer: Literal["sgd", "adam"] = "adam"
    seed: int = 0
    partition_seed: int | None = None
    min_clients: int = 1
    device: str = "auto"
    workers: int = 0
    hold_payloads: bool = False
    memo_mb: int = 1024
    client_threads: int | None = 1
    server_threads: int | None = 1
    cache_dir: str | None = ".cache/oneshotfl"
    group: str = ""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def validate(self) -> None:
        if NAMES_CHECKED.get():
            try:  # before any name is checked: a plugin may register it
                load_plugins(self.plugins)
            except PluginError as exc:
                raise ConfigError(str(exc)) from None
        if not self.methods:
            raise ConfigError("methods: expected at least one method, got none")
        self._validate_dataset()
        check_bounds(self)
        if not 0 <= self.malicious <= self.clients:
            raise ConfigError(
                f"malicious: expected between 0 and clients={self.clients}, got {self.malicious}"
            )
        if self.malicious > 0 and self.attack is None:
            raise ConfigError(
                f"attack: expected what the {self.malicious} malicious client(s) do "
                "(oneshotfl list attacks), got none"
            )
        if self.attack is not None:
            try:
                build_attacks(self.attack)
            except AttackError as exc:
                raise ConfigError(str(exc)) from None
        if not 1 <= self.min_clients <= self.clients:
            raise ConfigError(
                f"min_clients: expected between 1 and clients={self.clients}, "
                f"got {self.min_clients}"
            )
        if self.device not in DEVICE_CHOICES and not self.device.startswith("cuda:"):
            raise ConfigError(f"device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")
        self.client_train_config()
        self.server_train_config()

    def _validate_dataset(self) -> None:
        """A registered name, or a ``folder:``/``npz:`` spec whose options parse (its files
        are read only when the data are loaded)."""
        if not NAMES_CHECKED.get():
            return
        if is_user_spec(self.dataset):
            try:
                parse_user_spec(self.dataset)
            except UserDataError as exc:
                raise ConfigError(str(exc)) from None
        elif self.dataset not in DATASETS:
            raise ConfigError(
                f"dataset: unknown {self.dataset!r}{did_you_mean(self.dataset, DATASETS)}; "
                "expected one of: "
                f"{', '.join(DATASETS.names())}, or folder:path=DIR, npz:path=FILE or csv:path=FILE"
            )

    @property
    def diagnostic_size(self) -> int:
        """The test examples each client's own model is checked on (0: the whole split);
        see ``diagnostic_examples``."""
        if self.diagnostic_examples is not None:
            return self.diagnostic_examples
        return max(20, min(1000, 50_000 // self.clients))

    @property
    def data_seed(self) -> int:
        """The partition seed root: ``partition_seed``, else ``seed``."""
        return self.seed if self.partition_seed is None else self.partition_seed

    def client_train_config(self) -> TrainConfig:
        return TrainConfig(
            self.local_epochs,
            self.batch_size,
            self.lr,
            self.optimizer,
            self.momentum,
            self.weight_decay,
            self.local_steps,
            self.init,
            self.grad_clip,
            self.local_floor_epochs,
        )

    def server_train_config(self) -> TrainConfig:
        return TrainConfig(
            self.server_epochs,
            self.server_batch_size,
            self.server_lr,
            self.server_optimizer,
            self.momentum,
            self.weight_decay,
            self.server_steps,
            self.init,
            self.grad_clip,
        )

    def partitioner(self) -> Partitioner:
        """The configured partitioner.

        Raises:
            ConfigError: for an unknown partitioner or an option out of range.
        """
        try:
            return make_partitioner(
                self.partition,
                alpha=self.alpha,
                classes_per_client=self.classes_per_client,
                min_samples=self.min_samples,
                psi=self.psi,
            )
        except ValueError as exc:
            raise ConfigError(f"partition {self.partition!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["methods"] = list(self.methods)
        data["plugins"] = list(self.plugins)
        data["method_defaults"] = list(self.method_defaults)
        return data


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ExperimentConfig))


def make_config(values: Mapping[str, Any]) -> ExperimentConfig:
    """Build a config from a mapping of field names (dashes allowed) to values or strings;
    nested sections (``data``, ``clients``, ``server``, ``security``:
    :data:`~oneshotfl.runner.config_values.SECTIONS`) set the flat keys they name."""
    clean: dict[str, Any] = {}
    for raw_key, value in flatten_sections(values, FIELD_NAMES).items():
        key = str(raw_key).replace("-", "_")
        if key not in FIELD_NAMES:
            raise ConfigError(
                f"unknown config key {raw_key!r}{did_you_mean(key, FIELD_NAMES)}; "
                f"expected one of {list(FIELD_NAMES)}"
            )
        if key in ("methods", "method_defaults"):
            value = normalise_methods(value, key)
        elif key == "plugins":
            value = normalise_plugins(value)
        elif key == "model":
            value = normalise_model(value)
        clean[key] = value
    try:
        config: ExperimentConfig = coerce_params(ExperimentConfig, clean)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return config


def config_defaults() -> dict[str, Any]:
    """Every config key's default, in the form a result file records it."""
    with names_unchecked():
        return make_config({}).to_dict()


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    options: Mapping[str, Any] | None = None,
) -> ExperimentConfig:
    """Defaults < the YAML file < ``key=value`` overrides < explicit ``options`` (CLI flags)."""
    values = read_config_file(path) if path is not None else {}
    values.update(parse_overrides(overrides))
    values.update(options or {})
    return make_config(values)


__all__ = [
    "FIELD_NAMES",
    "NAMES_CHECKED",
    "ConfigError",
    "ExperimentConfig",
    "client_architectures",
    "config_defaults",
    "load_config",
    "make_config",
    "names_unchecked",
    "normalise_methods",
    "normalise_model",
    "normalise_plugins",
    "parse_overrides",
    "read_config_file",
]
