"""Registered one-shot FL methods. Importing this package registers every method.

Every module of this package is imported here (:func:`oneshotfl.registry.import_package_modules`),
so a method is one module: ``@register_method("name", "…")`` on its class in
``methods/<name>.py`` registers it, with no import list to edit. Methods from outside the
package come from plugins and entry points (:mod:`oneshotfl.plugins`).
"""

from oneshotfl.methods.base import METHODS, MethodSpec, build_method, parse_method_spec
from oneshotfl.registry import import_package_modules

MODULES = tuple(import_package_modules(__name__, __path__))
"""The package's modules, every one imported (the ones that register and their helpers)."""

__all__ = ["METHODS", "MODULES", "MethodSpec", "build_method", "parse_method_spec"]
