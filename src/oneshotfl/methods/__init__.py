"""Registered one-shot FL methods. Importing this package registers every method."""

from oneshotfl.methods import centralized, ensemble, fedavg, fedol, local  # noqa: F401  (registers)
from oneshotfl.methods.base import METHODS, MethodSpec, build_method, parse_method_spec

__all__ = ["METHODS", "MethodSpec", "build_method", "parse_method_spec"]
