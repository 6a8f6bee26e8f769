"""One registry type for methods, models, partitioners and datasets.

Shaped after timm's ``register_model`` / ``create_model`` / ``list_models``: a decorator adds an
entry under a unique name, a lookup by an unknown name raises an error that lists what exists.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name was looked up, or a name was registered twice."""

    def __str__(self) -> str:  # KeyError quotes its message; we want the plain sentence.
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object with its one-line description."""

    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """A name → object mapping filled by a decorator.

    Args:
        kind: what the registry holds ("method", "model", ...), used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator adding ``obj`` under ``name``; a duplicate name is an error."""

        def add(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            doc = description or _first_doc_line(obj)
            self._entries[name] = Entry(name, obj, doc)
            return obj

        return add

    def get(self, name: str) -> T:
        """Return the object registered under ``name``."""
        try:
            return self._entries[name].obj
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            hint = did_you_mean(name, self._entries)
            raise RegistryError(
                f"unknown {self.kind} {name!r}{hint}; expected one of: {known}"
            ) from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        """All entries, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'alpha'?)`` for the closest of ``choices`` to a mistyped ``name``, or
    ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _first_doc_line(obj: object) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def parse_spec(text: str, what: str) -> tuple[str, dict[str, str]]:
    """Parse a registry spec ``name`` or ``name:key=value:key=value`` (the CLI form).

    Args:
        text: the spec.
        what: what it names ("method", "encoder"), for the error message.

    Raises:
        ValueError: for an empty name or an option without ``=``.
    """
    name, *rest = text.strip().split(":")
    if not name:
        raise ValueError(f"{what} spec {text!r}: expected 'name[:key=value...]', got no name")
    options: dict[str, str] = {}
    for item in rest:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} spec {text!r}: expected key=value, got {item!r}")
        options[key.strip()] = value.strip()
    return name, options


def import_package_modules(package: str, path: Iterable[str]) -> list[str]:
    """Import every module of ``package`` (its ``__path__`` is ``path``), in name order, so
    that the decorators in them register what they define: a module dropped into the
    package registers without a hand-kept import list. Returns the modules' names.

    A module that fails to import raises as it would in a plain import (a package module
    with a syntax error is a bug, not a plugin to skip)."""
    names = sorted(info.name for info in pkgutil.iter_modules(list(path)))
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
