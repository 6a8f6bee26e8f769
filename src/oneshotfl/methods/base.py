"""The method registry and method specs (``name`` or ``name:key=value:key=value``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oneshotfl.params import coerce_params
from oneshotfl.protocol.contract import Method
from oneshotfl.registry import Registry, parse_spec

METHODS: Registry[type[Method[Any]]] = Registry("method")


def register_method(name: str, description: str = "") -> Any:
    """Class decorator: register a :class:`Method` subclass and set its ``name``."""
    add = METHODS.register(name, description)

    def decorate(cls: type[Method[Any]]) -> type[Method[Any]]:
        cls.name = name
        return add(cls)

    return decorate


@dataclass(frozen=True)
class MethodSpec:
    """A method name with hyper-parameter overrides and the label results use."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def key(self) -> str:
        """The label, or ``name`` plus its parameters."""
        if self.label:
            return self.label
        if not self.params:
            return self.name
        return self.name + ":" + ":".join(f"{k}={v}" for k, v in sorted(self.params.items()))


def parse_method_spec(text: str) -> MethodSpec:
    """Parse ``name`` or ``name:key=value:key=value`` (the CLI form).

    Raises:
        ValueError: for an empty name or a parameter without ``=``.
    """
    name, params = parse_spec(text, "method")
    return MethodSpec(name, params)


def build_method(spec: MethodSpec | str) -> Method[Any]:
    """Instantiate a registered method with its config built from ``spec.params``."""
    if isinstance(spec, str):
        spec = parse_method_spec(spec)
    cls = METHODS.get(spec.name)
    try:
        config = coerce_params(cls.Config, spec.params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"method {spec.name!r}: {exc}") from None
    return cls(config)
