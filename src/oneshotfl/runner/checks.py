"""What can be checked from a config alone, before any data is loaded or any client trains.

:func:`checked_names` checks the names a run uses (models, partitioner, feature skew);
:func:`requirement_problems` what each method's ``requires`` asks of the federation;
:func:`check_models_fit` that every architecture takes the task's input and
:func:`image_problems` that every method gets the images it needs (both once the data is
known). :func:`~oneshotfl.runner.plan.preflight` runs the first two once and returns the
checked plan a run executes; :meth:`~oneshotfl.runner.federation.Federation.prepare` the
last two.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from oneshotfl.data.feature_skew import FeatureSkew, FeatureSkewError, build_feature_skew
from oneshotfl.data.partition import Partitioner
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods import METHODS, MethodSpec, build_method, parse_method_spec
from oneshotfl.models import MODELS, create_model
from oneshotfl.protocol.contract import Method, Topology
from oneshotfl.registry import did_you_mean
from oneshotfl.runner.config import ConfigError, ExperimentConfig, client_architectures
from oneshotfl.runner.errors import first_line
from oneshotfl.training.encoder import Encoder

Methods = Sequence[tuple[str, Method[Any]]]


def _known(name: str, what: str) -> None:
    if name not in METHODS:
        raise ConfigError(
            f"{what}: unknown method {name!r}{did_you_mean(name, METHODS)}; "
            f"expected one of: {', '.join(METHODS.names())}"
        )


def method_defaults(defaults: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``method_defaults`` specs as method name → the knobs that replace its defaults.

    Raises:
        ConfigError: for an unknown method, a malformed spec or a method named twice.
    """
    out: dict[str, dict[str, Any]] = {}
    for text in defaults:
        try:
            spec = parse_method_spec(text)
        except ValueError as exc:
            raise ConfigError(f"method_defaults: {exc}") from None
        _known(spec.name, "method_defaults")
        if spec.name in out:
            raise ConfigError(
                f"method_defaults: expected each method once, got {spec.name!r} twice"
            )
        out[spec.name] = dict(spec.params)
    return out


def merged_specs(
    specs: Sequence[str], defaults: Sequence[str] = ()
) -> list[tuple[str, MethodSpec]]:
    """Each method spec as (its key — the spec as written —, the spec with the knobs of
    ``defaults`` (the config's ``method_defaults``) beneath its own).

    Raises:
        ConfigError: for a malformed spec, an unknown method, or one listed twice.
    """
    base = method_defaults(defaults)
    merged: list[tuple[str, MethodSpec]] = []
    for text in specs:
        try:
            spec = parse_method_spec(text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        _known(spec.name, "methods")
        merged.append((spec.key, MethodSpec(spec.name, {**base.get(spec.name, {}), **spec.params})))
    keys = [k for k, _ in merged]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"methods: the same method spec is listed twice in {keys}")
    return merged


def resolve_methods(
    specs: Sequence[str], defaults: Sequence[str] = ()
) -> list[tuple[str, Method[Any]]]:
    """Parse and build every method spec (:func:`merged_specs`), failing before any data is
    loaded; a method's key is its spec as written."""
    built: list[tuple[str, Method[Any]]] = []
    for key, spec in merged_specs(specs, defaults):
        try:
            built.append((key, build_method(spec)))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return built


def checked_names(
    cfg: ExperimentConfig,
) -> tuple[tuple[str, ...], Partitioner, FeatureSkew | None]:
    """The client architectures, the partitioner and the feature skew of ``cfg``.

    Raises:
        ConfigError: for an unknown model, a bad partitioner option or feature skew.
    """
    archs = client_architectures(cfg.model, cfg.clients)
    for arch in {*archs, *([cfg.server_model] if cfg.server_model else [])}:
        if arch not in MODELS:
            raise ConfigError(
                f"unknown model {arch!r}; expected one of: {', '.join(MODELS.names())}"
            )
    partitioner = cfg.partitioner()
    skew = None
    if cfg.feature_skew:
        try:
            skew = build_feature_skew(cfg.feature_skew)
        except FeatureSkewError as exc:
            raise ConfigError(str(exc)) from None
    return tuple(archs), partitioner, skew


def check_models_fit(archs: Sequence[str], server: str | None, task: TaskInfo) -> None:
    """Build every configured architecture once on the meta device (no memory, no weights)
    for the task's input: one that cannot take it (a CNN on a table's 1×1 "images") is refused
    here, before any training.

    Raises:
        ConfigError: naming the architecture and why.
    """
    for arch in dict.fromkeys([*archs, *([server] if server else [])]):
        try:
            with torch.device("meta"):
                create_model(arch, task.in_channels, task.num_classes, task.image_size)
        except ValueError as exc:
            raise ConfigError(
                f"model {arch!r} cannot take this data ({task.in_channels} channel(s), side "
                f"{task.image_size}): {exc}"
            ) from None


def _key(name: str) -> str:
    """A config key as a user may set it: the key (YAML, ``key=value``, the Python API) and
    the command line's flag."""
    return f"{name} (--{name.replace('_', '-')})"


def check_encoder_fits(encoder: Encoder, task: TaskInfo, device: torch.device) -> None:
    """Embed one blank input of the task with the shared encoder: one that cannot take it (a
    convolutional encoder on a table's 1×1 "images") is refused here, before any training.

    Raises:
        ConfigError: naming the encoder and why.
    """
    blank = torch.zeros(1, task.in_channels, task.image_size, task.image_size)
    try:
        encoder.embed(blank, device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"encoder {encoder.spec!r} cannot take this data ({task.in_channels} channel(s), "
            f"side {task.image_size}): {first_line(exc)}"
        ) from None


def requirement_problems(
    cfg: ExperimentConfig,
    methods: Methods,
    archs: Sequence[str],
    has_public: bool,
    has_encoder: bool,
) -> list[str]:
    """Every unmet requirement of every method, one sentence each."""
    problems: list[str] = []
    for key, method in methods:
        req = method.requires
        if req.public_data and not has_public:
            problems.append(f"{key} needs a public unlabelled pool: set {_key('public_size')} > 0")
        if req.same_architecture and len(set(archs)) > 1:
            problems.append(
                f"{key} needs identical client architectures (it merges their weights), got "
                f"{_clients_by_arch(archs)}"
            )
        if req.server_model and cfg.server_model is None:
            problems.append(f"{key} needs a server architecture: set {_key('server_model')}")
        if req.shared_encoder and not has_encoder:
            problems.append(
                f"{key} needs a shared frozen encoder: set {_key('encoder')} (e.g. random)"
            )
        if req.validation and cfg.val_fraction <= 0:
            problems.append(
                f"{key} needs a private validation split on every client: set "
                f"{_key('val_fraction')} > 0"
            )
        if cfg.clients < req.min_clients:
            problems.append(
                f"{key} needs at least {req.min_clients} clients, got {cfg.clients}: set "
                f"{_key('clients')} >= {req.min_clients}"
            )
        problems += [f"{key}: {p}" for p in method.setting_problems(cfg.client_train_config())]
        if req.topology is Topology.PEER and method.num_rounds() != 1:
            problems.append(f"{key}: peer methods run one round, got {method.num_rounds()}")
    return problems


def image_problems(methods: Methods, task: TaskInfo) -> list[str]:
    """Every method whose declared need of images (``Requires.images``, ``image_multiple``)
    the task's inputs cannot meet — a table's are 1×1 — one sentence each."""
    if task.image_size == 1:
        got = f"a table of {task.in_channels} features (inputs of side 1)"
    else:
        got = f"images of side {task.image_size}"
    return [
        f"{key} needs {method.requires.image_need} (it transforms or generates images), got {got}"
        for key, method in methods
        if not method.requires.takes_side(task.image_size)
    ]


def writable_dir(path: Path) -> Path:
    """``path`` as a directory results can be written to, created if missing: checked before
    any training, so a bad ``--out`` fails at once rather than after the work.

    Raises:
        ConfigError: when ``path`` is a file, or cannot be created or written.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: expected a directory, got a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--out {path}: expected a writable directory ({exc.strerror})") from None
    return path


def _clients_by_arch(archs: Sequence[str], shown: int = 6) -> str:
    """``cnn (clients 0, 2), mlp (clients 1, 3)``: which clients have which architecture."""
    groups: dict[str, list[int]] = {}
    for client, arch in enumerate(archs):
        groups.setdefault(arch, []).append(client)
    parts = []
    for arch, ids in sorted(groups.items()):
        listed = ", ".join(map(str, ids[:shown])) + (
            f", … ({len(ids)} in all)" if len(ids) > shown else ""
        )
        parts.append(f"{arch} (client{'s' if len(ids) > 1 else ''} {listed})")
    return "; ".join(parts)
