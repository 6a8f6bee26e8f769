"""Your own methods, models, datasets, … without editing the package.

Every registry (methods, models, datasets, partitioners, training components, graphs, attacks,
encoders, feature skews) takes entries from three places, all loaded before a run resolves a
name:

* **a module** named in the config (``plugins``; ``--plugin mypkg.methods`` on the command
  line, ``plugins=["mypkg.methods"]`` from Python, a file path ``--plugin my_method.py``
  too): it is imported, and its decorators (``@register_method("name", "…")``) register what
  it defines. The config carries it to every Flower node and worker process;
* **an installed package's entry points**, in the group of a registry — for a method::

      [project.entry-points."oneshotfl.methods"]
      my_method = "mypkg.methods:MyMethod"

  loading one imports its module; an object its module did not register is registered under
  the entry point's name (groups: :data:`GROUPS`);
* **Python**: import the module that registers (or call ``register_method(name)(cls)``)
  before ``oneshotfl.run``.

A plugin that cannot be imported is a one-line :class:`PluginError` naming it and why.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GROUPS: dict[str, tuple[str, str]] = {
    "oneshotfl.methods": ("oneshotfl.methods.base", "METHODS"),
    "oneshotfl.models": ("oneshotfl.models.base", "MODELS"),
    "oneshotfl.datasets": ("oneshotfl.data.datasets", "DATASETS"),
    "oneshotfl.partitioners": ("oneshotfl.data.partition", "PARTITIONERS"),
    "oneshotfl.components": ("oneshotfl.training.components", "COMPONENTS"),
    "oneshotfl.graphs": ("oneshotfl.protocol.graph", "GRAPHS"),
    "oneshotfl.attacks": ("oneshotfl.security.threats", "ATTACKS"),
    "oneshotfl.encoders": ("oneshotfl.encoders.base", "ENCODERS"),
    "oneshotfl.feature_skews": ("oneshotfl.data.feature_skew", "FEATURE_SKEWS"),
}
"""Entry-point group → the registry it fills (module, attribute)."""

_loaded: set[str] = set()
_scanned: list[bool] = []


class PluginError(ValueError):
    """A plugin module or entry point that cannot be loaded."""


def _registry(group: str) -> Any:
    module, attribute = GROUPS[group]
    return getattr(importlib.import_module(module), attribute)


def load_entry_points() -> list[str]:
    """Load every installed entry point of the :data:`GROUPS` (once per process); returns
    ``group:name`` of those loaded now."""
    done: list[str] = []
    if _scanned:
        return done
    for group in GROUPS:
        for ep in importlib.metadata.entry_points(group=group):
            label = f"{group}:{ep.name}"
            if label in _loaded:
                continue
            try:
                obj = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin entry point {ep.name!r} ({group} = {ep.value}): cannot load it: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            registry = _registry(group)
            if ep.name in registry and registry.get(ep.name) is not obj:
                raise PluginError(
                    f"plugin entry point {ep.name!r} ({group} = {ep.value}): expected a new "
                    "name, but another entry is registered under it"
                )
            if ep.name not in registry:
                try:
                    registry.register(ep.name)(obj)
                except Exception as exc:
                    raise PluginError(
                        f"plugin entry point {ep.name!r} ({group} = {ep.value}): cannot "
                        f"register it: {exc}"
                    ) from None
            _loaded.add(label)
            done.append(label)
    _scanned.append(True)  # after a failure, the next call tries again
    return done


def _registered(registry: Any, obj: object) -> bool:
    return any(entry.obj is obj for entry in registry.entries())


def plugin_module_name(path: Path) -> str:
    """The module name a plugin file is imported under: its stem and a hash of its absolute
    path, so two ``plugin.py`` files in different folders do not replace each other."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"oneshotfl_plugin_{stem}_{digest}"


def import_plugin(spec: str) -> None:
    """Import one plugin: a module name (``mypkg.methods``) or a ``.py`` file's path."""
    if spec in _loaded:
        return
    path = Path(spec)
    try:
        if spec.endswith(".py"):
            if not path.is_file():
                raise PluginError(f"plugin {spec!r}: expected a Python file, found none there")
            name = plugin_module_name(path)
            loader = importlib.util.spec_from_file_location(name, path)
            if loader is None or loader.loader is None:
                raise PluginError(f"plugin {spec!r}: expected a Python file it can import")
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module  # worker processes unpickle its classes by this name
            try:
                loader.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)  # a half-imported module is not left behind
                raise
        else:
            importlib.import_module(spec)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin {spec!r}: expected an importable module or .py file, got "
            f"{type(exc).__name__}: {exc}"
        ) from None
    _loaded.add(spec)
    log.debug("plugin %s loaded", spec)


def load_plugins(modules: Sequence[str] = ()) -> None:
    """The installed entry points, then ``modules`` (each once per process)."""
    load_entry_points()
    for spec in modules:
        import_plugin(spec)
