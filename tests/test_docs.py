"""The documentation site: method descriptions (one source for ``oneshotfl describe`` and the
method pages) and, when the ``docs`` extra is installed, the strict mkdocs build."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from oneshotfl.cli.describe import (
    describe,
    describe_method,
    docstring_markdown,
    method_page,
    methods_table,
    requirement_lines,
)
from oneshotfl.cli.main import app
from oneshotfl.methods import METHODS
from oneshotfl.registry import RegistryError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["fedavg", "fedage", "local", "fol-a"])
def test_describe_method_holds_the_docstring_requirements_and_every_field(name: str) -> None:
    cls = METHODS.get(name)
    module = inspect.getmodule(cls)
    assert module is not None and module.__doc__
    text = describe_method(name)
    assert text.startswith(inspect.cleandoc(module.__doc__).splitlines()[0])
    lines = text.splitlines()
    words = [f"  {w}" for w in requirement_lines(cls.requires)]
    start = lines.index("requires:") + 1
    assert lines[start : start + len(words)] == words
    assert lines[start + len(words)].startswith("hyper-parameters")
    assert "Requires(" not in text  # in words, never the dataclass's repr
    for f in dataclasses.fields(cls.Config):
        assert any(line.startswith(f"  {f.name} = ") for line in lines), f.name


@pytest.mark.parametrize("name", ["fedavg", "fedage", "ensemble"])
def test_describe_method_is_what_the_command_prints(name: str) -> None:
    result = CliRunner().invoke(app, ["describe", name])
    assert result.exit_code == 0
    assert result.output == describe_method(name) + "\n"


def test_an_unknown_method_is_a_registry_error() -> None:
    with pytest.raises(RegistryError, match="unknown method 'nope'"):
        describe_method("nope")


def test_the_method_page_is_the_described_text() -> None:
    d = describe("fedavg")
    page = method_page("fedavg")
    assert page.startswith("# fedavg\n") and d.summary in page
    assert "\n".join(d.settings) in page  # verbatim, in a preformatted block
    assert "## Requirements\n\n- **topology**: star" in page and "Requires(" not in page
    assert d.doc.splitlines()[0] in page
    assert ":mod:" not in page and "`oneshotfl.robust`" in page


def test_docstring_markdown_drops_roles_and_keeps_tables_as_typed() -> None:
    doc = (
        "See :func:`~a.b.c` and :mod:`x.y`.\n\n====  ====\nk     v\n====  ====\na     b\n====  ===="
    )
    lines = docstring_markdown(doc).splitlines()
    assert lines[0] == "See `c` and `x.y`."
    assert lines[2] == "```text" and lines[-1] == "```"
    assert lines[3:-1] == doc.splitlines()[2:]


def test_the_methods_table_lists_every_method() -> None:
    table = methods_table()
    for entry in METHODS.entries():
        assert f"| [`{entry.name}`]({entry.name}.md) |" in table


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts/mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_to_repository_files_become_text_and_broken_links_stay() -> None:
    pytest.importorskip("mkdocs")
    hooks = _hooks()
    docs, repo = str(ROOT / "docs"), str(ROOT)

    def rewrite(link: str) -> str:
        match = hooks._LINK.search(link)
        return hooks._outside_link(match, "", docs, repo)

    assert rewrite("[`a`](../benchmarks/core-fmnist.yaml)") == (
        "`a` (`benchmarks/core-fmnist.yaml`)"
    )
    assert rewrite("[`pyproject.toml`](../pyproject.toml)") == "`pyproject.toml`"
    for kept in ("[x](security.md)", "[x](../no/such/file.yaml)", "[x](https://flower.ai)"):
        assert rewrite(kept) == kept  # mkdocs checks these (a missing one fails --strict)


def test_the_site_builds_strictly_with_a_page_per_method(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    for name in METHODS.names():
        assert (site / "methods" / name / "index.html").is_file(), name
    for page in ("getting-started", "adding-a-method", "deploy", "benchmarks", "security"):
        assert (site / page / "index.html").is_file(), page
    assert "oneshotfl.protocol.contract.Method" in (site / "api/protocol/index.html").read_text()


def test_the_documented_sweep_file_is_a_valid_sweep() -> None:
    import yaml

    from oneshotfl.runner.sweep import parse_sweep

    page = (Path(__file__).resolve().parents[1] / "docs/getting-started.md").read_text()
    block = page.split("<!-- sweep-example -->")[1].split("```yaml")[1].split("```")[0]
    sweep = parse_sweep(yaml.safe_load(block))
    assert sweep.name == "dirichlet-digits"
    assert len(sweep.runs) == (2 + 1) * 3 * 2  # grid points × seeds × groups
