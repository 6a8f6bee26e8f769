"""The import graph of a package, read with ``ast`` (nothing is imported), and the checks of
``tests/test_layers.py``: circles between modules and between packages, and imports that go
up the layers of the table under ``## Layers`` in ``docs/architecture.md``.

Every import statement counts wherever it is: at module level, under ``if TYPE_CHECKING:``
and inside functions. ``from pkg import name`` is an import of the submodule ``pkg.name``
when that module exists, else of ``pkg`` itself; relative imports are resolved against the
importing module. Imports made from strings (``importlib.import_module``) are not seen.

A *unit* is what the layers table places: the first component under the package, written
``name/`` for a subpackage and ``name`` for a root module; the package's ``__init__`` is the
unit named after the package (``oneshotfl``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Module:
    """One module of the tree: its dotted name, its file, and whether it is a package's
    ``__init__``."""

    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Edge:
    """One import of a module of the tree by another.

    Attributes:
        importer: the importing module's dotted name.
        imported: the imported module's dotted name.
        line: the import statement's line in the importer.
        where: ``"module"``, ``"TYPE_CHECKING"`` or ``"function"``.
    """

    importer: str
    imported: str
    line: int
    where: str

    def __str__(self) -> str:
        where = "" if self.where == "module" else f", {self.where}"
        return f"{self.importer} -> {self.imported}  (line {self.line}{where})"


@dataclass
class Graph:
    """The imports between the modules of one package tree."""

    package: str
    modules: dict[str, Module]
    edges: list[Edge]
    unresolved: list[str]  # "importer:line imports X", X naming no module of the tree

    def successors(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            out[edge.importer].add(edge.imported)
        return out


# --------------------------------------------------------------------------- reading


def find_modules(src: Path, package: str) -> dict[str, Module]:
    """Every ``.py`` file under ``src/package``, by dotted name (``pkg.sub`` for
    ``pkg/sub/__init__.py``)."""
    modules: dict[str, Module] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` with where it sits (see :class:`Edge`)."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(nodes: Iterable[ast.AST], where: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append((node, where))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(ast.iter_child_nodes(node), "function")
            elif isinstance(node, ast.If) and where == "module" and _is_type_checking(node.test):
                visit(node.body, "TYPE_CHECKING")
                visit(node.orelse, where)
            else:
                visit(ast.iter_child_nodes(node), where)

    visit(tree.body, "module")
    return found


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module name a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(
    module: Module, node: ast.Import | ast.ImportFrom, modules: dict[str, Module], package: str
) -> list[str]:
    """The dotted names of the package's modules ``node`` imports (a name that is no module
    of the tree is kept, for :attr:`Graph.unresolved`)."""

    def inside(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if inside(alias.name)]
    source = _absolute(module, node)
    if not inside(source):
        return []
    wanted = [f"{source}.{alias.name}" for alias in node.names]
    found = [name for name in wanted if name in modules]
    if len(found) < len(wanted):  # the other names are attributes of ``source``
        found.append(source)
    return found


def build_graph(src: Path, package: str) -> Graph:
    """The import graph of ``src/package`` (see the module docs for what counts)."""
    modules = find_modules(src, package)
    edges: set[Edge] = set()
    unresolved: set[str] = set()
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        for node, where in _import_nodes(tree):
            for target in _targets(module, node, modules, package):
                if target not in modules:
                    unresolved.add(f"{module.name}:{node.lineno} imports {target}")
                elif target != module.name:
                    edges.add(Edge(module.name, target, node.lineno, where))
    ordered = sorted(edges, key=lambda e: (e.importer, e.imported, e.line))
    return Graph(package, modules, ordered, sorted(unresolved))


# --------------------------------------------------------------------------- circles


def _reachable(successors: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in successors.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def circles(successors: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted, in order."""
    nodes = set(successors) | {n for targets in successors.values() for n in targets}
    reach = {n: _reachable(successors, n) for n in nodes}
    found = {frozenset(m for m in reach[n] if n in reach[m]) for n in nodes}
    return sorted(sorted(c) for c in found if len(c) > 1)


def unit_of(module: str, package: str) -> str:
    """The layers-table unit a module belongs to: ``name/`` for a subpackage's module,
    ``name`` for a root module, ``package`` for the package's ``__init__``."""
    parts = module.split(".")
    if len(parts) == 1:
        return package
    return parts[1]


def unit_names(graph: Graph) -> dict[str, str]:
    """Each unit's bare name → its table spelling (``cli`` → ``cli/``)."""
    out: dict[str, str] = {}
    for module in graph.modules.values():
        parts = module.name.split(".")
        if len(parts) == 1:
            out[parts[0]] = parts[0]
        elif len(parts) == 2 and not module.is_package:
            out[parts[1]] = parts[1]
        else:
            out[parts[1]] = parts[1] + "/"
    return out


def unit_graph(graph: Graph) -> dict[str, set[str]]:
    """The imports between units (an import inside one unit is left out)."""
    out: dict[str, set[str]] = defaultdict(set)
    for edge in graph.edges:
        a, b = unit_of(edge.importer, graph.package), unit_of(edge.imported, graph.package)
        if a != b:
            out[a].add(b)
    return dict(out)


def module_circle_report(graph: Graph) -> str:
    """Every circle between modules with the imports that close it; empty when none."""
    blocks = []
    for circle in circles(graph.successors()):
        members = set(circle)
        inside = [e for e in graph.edges if e.importer in members and e.imported in members]
        lines = "\n".join(f"    {e}" for e in inside)
        blocks.append(f"  circle of {len(circle)} modules: {', '.join(circle)}\n{lines}")
    return "\n".join(blocks)


def unit_circle_report(graph: Graph) -> str:
    """Every circle between units with the module imports behind each unit edge."""
    names = unit_names(graph)
    blocks = []
    for circle in circles(unit_graph(graph)):
        members = set(circle)
        by_pair: dict[tuple[str, str], list[Edge]] = defaultdict(list)
        for e in graph.edges:
            a, b = unit_of(e.importer, graph.package), unit_of(e.imported, graph.package)
            if a != b and a in members and b in members:
                by_pair[(a, b)].append(e)
        lines = []
        for (a, b), pair_edges in sorted(by_pair.items()):
            lines.append(f"    {names.get(a, a)} -> {names.get(b, b)}:")
            lines += [f"      {e}" for e in pair_edges]
        spelled = ", ".join(names.get(u, u) for u in circle)
        blocks.append(f"  circle of {len(circle)} packages: {spelled}\n" + "\n".join(lines))
    return "\n".join(blocks)


# --------------------------------------------------------------------------- layers


def parse_layers(markdown: str, heading: str = "## Layers") -> dict[str, int]:
    """The table under ``heading``: each backticked name of its second column → its layer
    (the first column). Text in parentheses is a remark, not a name. A name on two rows
    raises ``ValueError``; so does a missing heading or table."""
    lines = markdown.splitlines()
    if heading not in (line.strip() for line in lines):
        raise ValueError(f"expected a heading {heading!r}, found none")
    start = [line.strip() for line in lines].index(heading) + 1
    rows: list[str] = []
    for line in lines[start:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            break
        if stripped.startswith("|"):
            rows.append(stripped)
        elif rows:
            break
    if len(rows) < 3:
        raise ValueError(f"expected a table with a header and rows under {heading!r}, found none")
    layers: dict[str, int] = {}
    for row in rows[2:]:  # past the header and the |---| line
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) < 2:
            raise ValueError(f"layers table: expected at least two columns, got {row!r}")
        layer = int(cells[0])
        for name in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[1])):
            if name in layers:
                raise ValueError(f"layers table: {name!r} is on layers {layers[name]} and {layer}")
            layers[name] = layer
    return layers


def table_problems(graph: Graph, layers: dict[str, int]) -> list[str]:
    """Units of the tree the table does not place, and names in the table that are not units
    of the tree (a package is written ``name/``, a root module ``name``)."""
    actual = set(unit_names(graph).values())
    problems = [f"not in the table: `{name}`" for name in sorted(actual - set(layers))]
    problems += [
        f"in the table, not in the tree: `{name}`" for name in sorted(set(layers) - actual)
    ]
    return problems


def layer_violations(graph: Graph, layers: dict[str, int]) -> list[str]:
    """Every import from a unit on a higher layer than the importer's, as
    ``importer -> imported (layer a -> layer b)``; units the table lacks are skipped."""
    names = unit_names(graph)
    out = []
    for e in graph.edges:
        a = names[unit_of(e.importer, graph.package)]
        b = names[unit_of(e.imported, graph.package)]
        if a in layers and b in layers and layers[b] > layers[a]:
            where = "" if e.where == "module" else f", {e.where}"
            out.append(
                f"{e.importer} -> {e.imported} (layer {layers[a]} `{a}` -> layer {layers[b]} "
                f"`{b}`; line {e.line}{where})"
            )
    return out
