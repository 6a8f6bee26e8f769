"""The pieces of a config that need no other part of oneshotfl: its error, the switch that
reads a recorded config back without importing plugins, and the normalisation of the fields
given in several forms (``methods``, ``plugins``, ``model``), the nested config sections
(:data:`SECTIONS`), and the bounds of its numeric fields (:func:`check_bounds`) — see
:mod:`oneshotfl.runner.config`."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration that cannot be run, with a sentence saying why."""


NAMES_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("names_checked", default=True)
"""Whether a config being built imports its plugins and checks its registry names (off only
while a recorded config is read back: reading a result never runs its plugins' code)."""


@contextlib.contextmanager
def names_unchecked() -> Iterator[None]:
    """Build configs without importing plugins or checking registry names (a result read
    back: :func:`oneshotfl.runner.results.recorded_config`)."""
    token = NAMES_CHECKED.set(False)
    try:
        yield
    finally:
        NAMES_CHECKED.reset(token)


def normalise_plugins(value: Any) -> tuple[str, ...]:
    """Plugins from a comma string or a list of module names / file paths."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"plugins: expected module names or .py paths, got {value!r}")
    return tuple(v.strip() for v in items if v.strip())


def normalise_methods(value: Any, key: str = "methods") -> tuple[str, ...]:
    """Methods (or ``method_defaults``, named by ``key``) from a comma string, a list of
    specs, or YAML mappings, as spec strings."""
    if value is None and key != "methods":
        return ()
    if isinstance(value, str):
        items: Sequence[Any] = [v for v in value.split(",") if v.strip()]
    elif isinstance(value, Sequence):
        items = value
    else:
        raise ConfigError(f"{key}: expected a list or comma-separated string, got {value!r}")
    specs = []
    for item in items:
        if isinstance(item, Mapping):
            params = {k: v for k, v in item.items() if k != "name"}
            if "name" not in item:
                raise ConfigError(f"{key}: a mapping needs a 'name' key, got {dict(item)}")
            specs.append(":".join([str(item["name"]), *(f"{k}={v}" for k, v in params.items())]))
        else:
            specs.append(str(item).strip())
    return tuple(specs)


def run_defaults(methods: Sequence[str], defaults: Sequence[str]) -> list[str]:
    """The ``method_defaults`` entries naming a method in ``methods``: the ones that can
    change a result (a comparison of two configs ignores the others)."""
    names = {str(m).split(":", 1)[0].strip() for m in methods}
    return [d for d in defaults if str(d).split(":", 1)[0].strip() in names]


def normalise_model(value: Any) -> str:
    """Client architectures from a string, a list, or a mapping, as the string form."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, Sequence):
        return ",".join(str(v) for v in value)
    raise ConfigError(f"model: expected a name, list or mapping, got {value!r}")


def client_architectures(model: str, clients: int) -> tuple[str, ...]:
    """Expand the ``model`` field into one architecture per client.

    Raises:
        ConfigError: when a mapping leaves a client without an architecture.
    """
    items = [m.strip() for m in model.split(",") if m.strip()]
    if not items:
        raise ConfigError("model: expected at least one architecture name, got none")
    if not any("=" in m for m in items):
        return tuple(items[i % len(items)] for i in range(clients))
    mapping: dict[str, str] = {}
    for item in items:
        key, sep, arch = item.partition("=")
        if not sep:
            raise ConfigError(f"model: expected client=arch in a mapping, got {item!r}")
        mapping[key.strip()] = arch.strip()
    archs: list[str] = []
    for cid in range(clients):
        found = mapping.get(str(cid), mapping.get("*"))
        if found is None:
            raise ConfigError(f"model: client {cid} has no architecture; add '*=NAME'")
        archs.append(found)
    return tuple(archs)


SECTIONS: dict[str, dict[str, str]] = {
    "data": {
        "dataset": "dataset",
        "root": "data_root",
        "download": "download",
        "max_train": "max_train",
        "public_size": "public_size",
        "val_fraction": "val_fraction",
        "partition": "partition",
        "alpha": "alpha",
        "classes_per_client": "classes_per_client",
        "psi": "psi",
        "min_samples": "min_samples",
        "feature_skew": "feature_skew",
        "seed": "partition_seed",
    },
    "clients": {
        "count": "clients",
        "model": "model",
        "max_examples": "max_client_examples",
        "epochs": "local_epochs",
        "steps": "local_steps",
        "floor_epochs": "local_floor_epochs",
        "batch": "client_batch",
        "diagnostic_examples": "diagnostic_examples",
        "init": "init",
        "batch_size": "batch_size",
        "lr": "lr",
        "optimizer": "optimizer",
        "momentum": "momentum",
        "weight_decay": "weight_decay",
        "threads": "client_threads",
        "workers": "workers",
    },
    "server": {
        "model": "server_model",
        "epochs": "server_epochs",
        "steps": "server_steps",
        "batch_size": "server_batch_size",
        "lr": "server_lr",
        "optimizer": "server_optimizer",
        "min_clients": "min_clients",
        "threads": "server_threads",
    },
    "security": {"malicious": "malicious", "attack": "attack"},
}
"""Nested config sections: section → its own names → the flat config key each sets. A YAML
file (or a mapping) may group settings this way (``clients: {count: 10, epochs: 5}``,
``server: {model: resnet18}``); a section also takes any flat key as it is (``clients:
{local_epochs: 2}``), so a new setting needs no entry here; the flat keys are still read at the
top level, and a result records the flat form."""


def flatten_sections(values: Mapping[str, Any], known: Collection[str]) -> dict[str, Any]:
    """``values`` with every section mapping (:data:`SECTIONS`) replaced by the flat keys it
    sets (its own names, or any of the ``known`` flat keys); a value that is not a mapping
    (``clients: 10``) is the flat key itself.

    Raises:
        ConfigError: for an unknown key in a section, or a setting given twice.
    """
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        section = SECTIONS.get(key)
        items = value.items() if section is not None and isinstance(value, Mapping) else None
        pairs = [(key, value, key)] if items is None else []
        for sub, sub_value in items or ():
            name = str(sub).replace("-", "_")
            if section is not None and name not in section and name not in known:
                raise ConfigError(
                    f"config section {key}: unknown key {sub!r}; expected some of "
                    f"{sorted(section)} or a flat config key"
                )
            flat_key = section.get(name, name) if section is not None else name
            pairs.append((flat_key, sub_value, f"{key}.{name}"))
        for flat_key, flat_value, written in pairs:  # a flat key twice: the last one wins
            if flat_key in flat and "." in origin[flat_key] + written:
                raise ConfigError(
                    f"config: {flat_key} given twice, as {origin[flat_key]} and {written}"
                )
            flat[flat_key], origin[flat_key] = flat_value, written
    return flat


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings (values parsed as YAML scalars/lists) into a mapping."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping of settings in a YAML config file."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, Mapping):
        raise ConfigError(
            f"config file {path}: expected a mapping of settings, got {type(loaded).__name__}"
        )
    return dict(loaded or {})


BOUNDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("clients", lambda v: v >= 1, ">= 1"),
    ("public_size", lambda v: v >= 0, ">= 0"),
    ("val_fraction", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("max_train", lambda v: v is None or v >= 1, ">= 1 or None"),
    ("max_client_examples", lambda v: v >= 0, ">= 0 (0: the pool)"),
    ("local_floor_epochs", lambda v: v is None or v >= 0, ">= 0 (0: no bound)"),
    ("diagnostic_examples", lambda v: v is None or v >= 0, ">= 0 (0: no bound)"),
    ("client_batch", lambda v: v >= 1, ">= 1 (1: one client at a time)"),
    ("workers", lambda v: v >= 0, ">= 0 (0: one per core)"),
    ("memo_mb", lambda v: v >= 0, ">= 0 (0: no bound)"),
    ("client_threads", lambda v: v is None or v >= 1, ">= 1 or None"),
    ("server_threads", lambda v: v is None or v >= 1, ">= 1 or None"),
)
"""The config's numeric fields that stand alone: name, the check, what it expects."""


def check_bounds(config: object) -> None:
    """Check each field of :data:`BOUNDS` on ``config``.

    Raises:
        ConfigError: naming the first field out of bounds, what it expects and what came.
    """
    for name, ok, expected in BOUNDS:
        value = getattr(config, name)
        if not ok(value):
            raise ConfigError(f"{name}: expected {expected}, got {value}")
