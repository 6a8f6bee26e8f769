"""Load named top-level functions of an authors' repository file *unedited*: their source is
parsed out of the file and executed alone, so the rest of the module (its CLI, its datasets,
its pinned imports) is never run. The checkout's folder comes from an environment variable.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def authors_functions(
    env: str, file: str, names: tuple[str, ...], scope: dict[str, Any]
) -> dict[str, Callable[..., Any]]:
    """``names`` from ``$env/file``, run in ``scope`` (the globals they need)."""
    root = os.environ.get(env)
    if not root:
        raise ValueError(f"expected {env} naming a checkout of the authors' code, got nothing")
    path = Path(root) / file
    if not path.is_file():
        raise ValueError(f"expected the authors' file at {path}, got nothing")
    tree = ast.parse(path.read_text(), str(path))
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    found = {n.name for n in body}
    if found != set(names):
        raise ValueError(f"{path}: expected functions {sorted(names)}, found {sorted(found)}")
    namespace = dict(scope)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}
