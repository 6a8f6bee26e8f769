"""The pieces of a config that need no other part of oneshotfl: its error, the switch that
reads a recorded config back without importing plugins, and the normalisation of the fields
given in several forms (``methods``, ``plugins``, ``model``) — see
:mod:`oneshotfl.runner.config`."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


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
