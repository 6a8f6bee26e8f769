"""The package's layering: no two modules, and no two packages, import each other in a circle,
and nothing imports from a layer above its own in the table under ``## Layers`` of
``docs/architecture.md``. Imports under ``if TYPE_CHECKING:`` and inside functions count.

The machinery is :mod:`layering` (in this folder); the tests at the end run it on tiny fake
packages, so a check that finds nothing has been shown to find something.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layering import (
    Edge,
    Graph,
    build_graph,
    circles,
    layer_violations,
    module_circle_report,
    parse_layers,
    table_problems,
    unit_circle_report,
    unit_graph,
)

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(ROOT / "src", "oneshotfl")


def test_the_protocol_reaches_no_threat_artefact_store_or_encoder_module(graph: Graph) -> None:
    """The method contract is data: it imports no threat model, and the artefact store and
    the encoder only as the training layer's services (``training.services``)."""
    banned = ("oneshotfl.security", "oneshotfl.encoders", "oneshotfl.training.artefacts",
              "oneshotfl.training.encoder")  # fmt: skip
    found = [
        f"{e.importer} -> {e.imported} (line {e.line})"
        for e in graph.edges
        if e.importer.startswith("oneshotfl.protocol")
        and any(e.imported == b or e.imported.startswith(b + ".") for b in banned)
    ]
    assert not found, "\n".join(found)


@pytest.fixture(scope="module")
def layers() -> dict[str, int]:
    return parse_layers(ARCHITECTURE.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the real tree


def test_the_tree_is_read(graph: Graph) -> None:
    assert len(graph.modules) > 50 and len(graph.edges) > 200
    assert "oneshotfl.runner.engine" in graph.modules


def test_every_internal_import_names_a_module(graph: Graph) -> None:
    """An import the graph cannot place is an import no check below sees."""
    if graph.unresolved:
        lines = "\n".join(f"  {line}" for line in graph.unresolved)
        pytest.fail(f"imports of oneshotfl names that are no module:\n{lines}", pytrace=False)


def test_no_module_imports_itself_through_others(graph: Graph) -> None:
    report = module_circle_report(graph)
    if report:
        pytest.fail(
            "modules that import each other in a circle (imports under TYPE_CHECKING and "
            "inside functions count; move the shared piece into a lower module, or pass it "
            f"in):\n{report}",
            pytrace=False,
        )


def test_no_package_imports_itself_through_others(graph: Graph) -> None:
    report = unit_circle_report(graph)
    if report:
        pytest.fail(
            "packages that import each other in a circle (the module imports behind each "
            f"step):\n{report}",
            pytrace=False,
        )


def test_the_layers_table_places_every_package_and_root_module(
    graph: Graph, layers: dict[str, int]
) -> None:
    problems = "\n".join(f"  {p}" for p in table_problems(graph, layers))
    if problems:
        pytest.fail(
            f"the table under '## Layers' in {ARCHITECTURE.relative_to(ROOT)} does not match "
            f"src/oneshotfl (a package is written `name/`, a root module `name`):\n{problems}",
            pytrace=False,
        )


def test_no_import_goes_up_a_layer(graph: Graph, layers: dict[str, int]) -> None:
    violations = "\n".join(f"  {v}" for v in layer_violations(graph, layers))
    if violations:
        pytest.fail(
            f"imports from a higher layer (see '## Layers' in {ARCHITECTURE.relative_to(ROOT)}; "
            f"the same layer is allowed):\n{violations}",
            pytrace=False,
        )


# --------------------------------------------------------------------------- the machinery


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (paths under ``root/src``) and return ``root/src``; every folder gets
    an ``__init__.py`` unless one is given."""
    src = root / "src"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [p for p in src.rglob("*") if p.is_dir()]:
        (folder / "__init__.py").touch()
    return src


def test_a_circle_is_found_through_type_checking_and_function_imports(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "fake/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from fake import b\n",
            "fake/b.py": "def f() -> None:\n    from .c import thing\n",
            "fake/c.py": "import fake.a\nthing = 1\n",
            "fake/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a",
        },
    )
    graph = build_graph(src, "fake")
    assert circles(graph.successors()) == [["fake.a", "fake.b", "fake.c"]]
    report = module_circle_report(graph)
    assert "fake.a -> fake.b  (line 3, TYPE_CHECKING)" in report
    assert "fake.b -> fake.c  (line 2, function)" in report
    assert "fake.c -> fake.a  (line 1)" in report
    assert "fake.d" not in report
    assert Edge("fake.d", "fake.a", 3, "TYPE_CHECKING") in graph.edges


def test_relative_and_from_package_imports_resolve(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "fake/pkg/__init__.py": "from .sub import mod\n",
            "fake/pkg/sub/__init__.py": "VALUE = 1\n",
            "fake/pkg/sub/mod.py": "from .. import sub\nfrom . import VALUE\nimport os\n",
            "fake/x.py": "import os.path\nfrom fake.pkg.sub import VALUE, mod\nfrom fake import *",
        },
    )
    graph = build_graph(src, "fake")
    assert {(e.importer, e.imported) for e in graph.edges} == {
        ("fake.pkg", "fake.pkg.sub.mod"),
        ("fake.pkg.sub.mod", "fake.pkg.sub"),  # twice, once per line
        ("fake.x", "fake.pkg.sub"),
        ("fake.x", "fake.pkg.sub.mod"),
        ("fake.x", "fake"),
    }
    assert graph.unresolved == []
    assert circles(graph.successors()) == []


def test_an_import_of_no_module_is_reported(tmp_path: Path) -> None:
    src = _tree(tmp_path, {"fake/a.py": "def f() -> None:\n    from fake.gone import x\n"})
    assert build_graph(src, "fake").unresolved == ["fake.a:2 imports fake.gone"]


def test_a_package_circle_is_found_where_the_modules_have_none(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "fake/low/a.py": "from fake.high import b\n",
            "fake/high/b.py": "import fake.low.c\n",
            "fake/low/c.py": "",
            "fake/util.py": "from fake.low import c\n",
        },
    )
    graph = build_graph(src, "fake")
    assert module_circle_report(graph) == ""
    assert circles(unit_graph(graph)) == [["high", "low"]]
    report = unit_circle_report(graph)
    assert "circle of 2 packages: high/, low/" in report
    assert "low/ -> high/:\n      fake.low.a -> fake.high.b  (line 1)" in report
    assert "util" not in report


TABLE = """# Architecture

## Layers

Some words.

| layer | packages and modules | what they hold |
|---|---|---|
| 2 | `fake` (the package's `__init__`), `high/` | the top |
| 1 | `low/`, `ghost` | the bottom |

## Next

| layer | packages and modules | what they hold |
|---|---|---|
| 9 | `elsewhere` | not this table |
"""


def test_the_layers_table_is_read() -> None:
    assert parse_layers(TABLE) == {"fake": 2, "high/": 2, "low/": 1, "ghost": 1}
    with pytest.raises(ValueError, match="on layers 2 and 1"):
        parse_layers(TABLE.replace("`ghost`", "`high/`"))
    with pytest.raises(ValueError, match="expected a heading"):
        parse_layers(TABLE.replace("## Layers", "## Tiers"))


def test_a_layer_violation_and_table_gaps_are_found(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "fake/__init__.py": "from fake.low import a\n",  # down: allowed
            "fake/low/a.py": "\n\nfrom fake.high import b\n",  # up: a violation
            "fake/high/b.py": "import fake.low.c\nfrom fake.high import d\n",  # down, same
            "fake/high/d.py": "",
            "fake/low/c.py": "",
            "fake/util.py": "import fake\n",  # not in the table: not judged
        },
    )
    graph = build_graph(src, "fake")
    layers = parse_layers(TABLE)
    assert layer_violations(graph, layers) == [
        "fake.low.a -> fake.high.b (layer 1 `low/` -> layer 2 `high/`; line 3)"
    ]
    assert table_problems(graph, layers) == [
        "not in the table: `util`",
        "in the table, not in the tree: `ghost`",
    ]
    # a package written as a root module is both missing and unknown
    wrong = {**layers, "high": layers["high/"]}
    del wrong["high/"]
    assert "not in the table: `high/`" in table_problems(graph, wrong)
    assert "in the table, not in the tree: `high`" in table_problems(graph, wrong)


def test_an_edge_reads_as_importer_to_imported() -> None:
    assert str(Edge("p.a", "p.b", 7, "function")) == "p.a -> p.b  (line 7, function)"
    assert str(Edge("p.a", "p.b", 7, "module")) == "p.a -> p.b  (line 7)"
