"""Frozen hyper-parameter dataclasses: one validation path for all of them.

Every configuration in oneshotfl — a method's ``Config``, the training settings, the
experiment — is a frozen dataclass that subclasses :class:`Params`. ``Literal`` fields are
checked once, here, for every class (``weighting="median"`` against
``Literal["uniform", "size"]`` fails with a sentence naming the field, the options and the
value); a class adds its range checks in :meth:`Params.validate` with :func:`require`.
:func:`coerce_params` builds a config from strings (the CLI's ``name:key=value`` form).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from oneshotfl.registry import did_you_mean

_ENTRY = re.compile(r"^ {4}(\w[\w, ]*):\s*(.*)$")


class Params:
    """Base of every frozen hyper-parameter dataclass (see the module docs)."""

    def __post_init__(self) -> None:
        check_literals(self)
        self.validate()

    def validate(self) -> None:
        """Range and consistency checks of a subclass (raise ``ValueError`` via
        :func:`require`); the base has none."""


def is_int(value: object, low: int | None = None) -> bool:
    """An int (not a bool), at least ``low`` when given."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (low is None or value >= low)  # type: ignore[operator]


def is_number(value: object) -> bool:
    """An int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def require(ok: bool, name: str, expected: str, got: object) -> None:
    """Raise ``ValueError("<name>: expected <expected>, got <got>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {got!r}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def literal_options(hint: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` (or ``Literal[...] | None``) hint, else None."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options: list[Any] = []
        for arg in typing.get_args(hint):
            if arg is type(None):
                options.append(None)
                continue
            inner = literal_options(arg)
            if inner is None:
                return None
            options.extend(inner)
        return tuple(options)
    return None


def check_literals(config: object) -> None:
    """Raise ``ValueError`` for a ``Literal``-typed field holding a value outside its options."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        options = literal_options(hints.get(f.name))
        value = getattr(config, f.name)
        if options is not None and value not in options:
            allowed = "|".join("None" if o is None else str(o) for o in options)
            raise ValueError(f"{f.name}: expected one of {allowed}, got {value!r}")


def attribute_docs(cls: type) -> dict[str, str]:
    """``field → description`` from the Google-style ``Attributes:`` sections of ``cls`` and
    its bases (a subclass's entry wins), the text as written (literals keep their double
    backticks; continuation lines joined). An entry ``a, b: text`` documents both fields.

    This is where a hyper-parameter's words live: ``oneshotfl describe``, the method pages of
    the documentation site and the command's option help all read them from here.
    """
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        for name, text in _own_attribute_docs(klass).items():
            docs.setdefault(name, text)
    return docs


def _own_attribute_docs(cls: type) -> dict[str, str]:
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    lines = doc.splitlines()
    if "Attributes:" not in lines:
        return {}
    docs: dict[str, str] = {}
    names: list[str] = []
    for line in lines[lines.index("Attributes:") + 1 :]:
        if line and not line.startswith(" "):
            break  # the section ends where unindented text resumes
        match = _ENTRY.match(line)
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            for name in names:
                docs[name] = match.group(2).strip()
        elif line.startswith(" " * 8) and names:
            for name in names:
                docs[name] = f"{docs[name]} {line.strip()}".strip()
    return docs


def coerce_params(config_cls: type, params: Mapping[str, Any]) -> Any:
    """Build ``config_cls(**params)``, converting strings (from the CLI) to the field types.

    Raises:
        ValueError: for an unknown parameter or a value that does not convert.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        hint = did_you_mean(unknown[0], fields)
        raise ValueError(
            f"unknown parameter(s) {unknown}{hint} for {config_cls.__qualname__}; "
            f"expected some of {sorted(fields)}"
        )
    hints = _hints(config_cls)
    values = {k: _coerce(k, v, hints[k]) for k, v in params.items()}
    return config_cls(**values)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    if not isinstance(value, str):
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = options[0] if len(options) == 1 else str
        if typing.get_origin(hint) is typing.Literal and value in typing.get_args(hint):
            return value  # a literal value "none" is that value, not None
        if value.lower() in ("none", "null"):
            return None
        if typing.get_origin(hint) is typing.Literal:
            return value
    try:
        if hint is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint in (int, float, str):
            return hint(value)
    except ValueError:
        raise ValueError(
            f"parameter {name!r}: expected {getattr(hint, '__name__', hint)}, got {value!r}"
        ) from None
    return value
