"""Load named top-level definitions of an authors' repository file *unedited*: their source
is parsed out of the file and executed alone, so the rest of the module (its CLI, its
datasets, its pinned imports) is never run. The checkout's folder comes from an environment
variable.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def authors_file(env: str, file: str) -> Path:
    """``$env/file``, which must exist."""
    root = os.environ.get(env)
    if not root:
        raise ValueError(f"expected {env} naming a checkout of the authors' code, got nothing")
    path = Path(root) / file
    if not path.is_file():
        raise ValueError(f"expected the authors' file at {path}, got nothing")
    return path


def authors_digest(env: str, files: Sequence[str]) -> str:
    """SHA-256 over the bytes of ``files`` of ``$env``'s checkout, in order (part of a plugin's
    cache keys: another checkout never reads a stale artefact). Read once a process for each
    checkout folder: a plugin asks for it once a client."""
    paths = tuple(authors_file(env, f) for f in files)
    return _digest(paths)


@functools.cache
def _digest(paths: tuple[Path, ...]) -> str:
    return hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()


@contextlib.contextmanager
def seeded_globals(
    seed: int, device: torch.device, cudnn_deterministic: bool = False
) -> Iterator[None]:
    """The global ``random``, NumPy and torch (CPU and ``device``) generators seeded with
    ``seed`` inside the block, as an authors' ``setup_seed`` seeds them once, and cuDNN
    deterministic there when ``cudnn_deterministic``; all restored on exit."""
    states = random.getstate(), np.random.get_state()
    deterministic = torch.backends.cudnn.deterministic
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        seed &= 0xFFFF_FFFF
        for generator in (random.seed, np.random.seed, torch.manual_seed):
            generator(seed)
        torch.backends.cudnn.deterministic = deterministic or cudnn_deterministic
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.backends.cudnn.deterministic = deterministic


def timed(function: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    """``function`` as it is, each call's wall seconds appended to ``seconds`` (an authors'
    evaluation inside a timed step, to leave out of the step's time)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    return call


def _defined(node: ast.stmt) -> str | None:
    """The name a top-level statement defines (a function, a class, ``NAME = …``)."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def authors_definitions(
    env: str, file: str, names: tuple[str, ...], scope: dict[str, Any]
) -> dict[str, Any]:
    """The top-level functions, classes and single-name assignments called ``names`` in
    ``$env/file``, their source executed alone, in file order, in ``scope`` (the globals
    they need)."""
    path = authors_file(env, file)
    tree = ast.parse(path.read_text(), str(path))
    body = [n for n in tree.body if _defined(n) in names]
    found = [str(_defined(n)) for n in body]
    if sorted(found) != sorted(names):
        raise ValueError(f"{path}: expected one each of {sorted(names)}, found {sorted(found)}")
    namespace = dict(scope)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def authors_functions(
    env: str, file: str, names: tuple[str, ...], scope: dict[str, Any]
) -> dict[str, Callable[..., Any]]:
    """``names`` (functions) from ``$env/file``, run in ``scope`` (the globals they need)."""
    return authors_definitions(env, file, names, scope)


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists inside a compound statement (its body, else-branch, handlers' and
    cases' bodies, finally-block)."""
    blocks = [getattr(node, n, None) for n in ("body", "orelse", "finalbody")]
    blocks += [h.body for h in getattr(node, "handlers", [])]
    blocks += [c.body for c in getattr(node, "cases", [])]
    return [b for b in blocks if isinstance(b, list) and b]


def _statements(body: list[ast.stmt], first: int, last: int) -> list[ast.stmt]:
    """The statements of one block, at any depth, that make up lines first..last: the block
    holding the whole range, searched inside the one statement that contains it.

    Raises:
        ValueError: when the range cuts a statement (a compound one included: running part of
            an ``if`` would run its branches without their condition).
    """
    overlapping = [n for n in body if n.lineno <= last and (n.end_lineno or n.lineno) >= first]
    whole = [n for n in overlapping if first <= n.lineno and (n.end_lineno or n.lineno) <= last]
    if whole == overlapping:  # the block holds the range whole (or none of it)
        return whole
    if len(overlapping) == 1 and overlapping[0].lineno < first:
        node = overlapping[0]
        if (node.end_lineno or node.lineno) >= last:  # it holds the range: look inside
            for block in _blocks(node):
                found = _statements(block, first, last)
                if found and found[0].lineno == first and found[-1].end_lineno == last:
                    return found
            overlapping = [node]  # the range spans more than one of its blocks
    cut = next(n for n in overlapping if n not in whole)
    raise ValueError(
        f"lines {first}–{last} cut the statement of lines {cut.lineno}–{cut.end_lineno}:"
        " expected whole statements of one block"
    )


def authors_lines(
    env: str, file: str, first: int, last: int, scope: dict[str, Any]
) -> dict[str, Any]:
    """Run lines ``first``–``last`` of ``$env/file`` unedited — statements nested in a block
    (a script's ``if __name__ == "__main__":`` loop) included — in a copy of ``scope`` (the
    names those lines read, as the surrounding code would have bound them); the namespace
    afterwards. The range must begin and end on whole statements.

    Raises:
        ValueError: when the lines do not begin and end with whole statements.
    """
    path = authors_file(env, file)
    tree = ast.parse(path.read_text(), str(path))
    try:
        body = _statements(tree.body, first, last)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not body or body[0].lineno != first or (body[-1].end_lineno or 0) != last:
        got = f"{body[0].lineno}–{body[-1].end_lineno}" if body else "none"
        raise ValueError(
            f"{path}: expected whole statements from line {first} to {last}, got lines {got}"
        )
    namespace = dict(scope)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


_TEST: dict[str, Any] = {}


def test_split(task: Any, plugin: str) -> Any:
    """The dataset of ``task`` (a :class:`oneshotfl.data.types.TaskInfo`) reloaded by name: its
    test split, once per process, for a plugin whose authors' code evaluates on the server.

    Raises:
        ValueError: when its inputs or labels do not fit the run's task (``plugin`` names the
            plugin in the one-line message).
    """
    from oneshotfl.data.datasets import load_dataset

    if task.dataset not in _TEST:
        _TEST[task.dataset] = load_dataset(task.dataset).test
    test = _TEST[task.dataset]
    shape = (task.in_channels, task.image_size, task.image_size)
    if tuple(test.x.shape[1:]) != shape or int(test.y.max()) >= task.num_classes:
        raise ValueError(
            f"{plugin}: expected the test split of {task.dataset} with inputs {shape} and "
            f"{task.num_classes} classes, got inputs {tuple(test.x.shape[1:])} (a feature skew?)"
        )
    return test
