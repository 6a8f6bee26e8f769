"""The documentation site: method descriptions (one source for ``oneshotfl describe`` and the
method pages) and, when the ``docs`` extra is installed, the strict mkdocs build."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote

import pytest
from typer.testing import CliRunner

from helpers import load_script
from oneshotfl.cli.describe import (
    describe,
    describe_method,
    docstring_markdown,
    method_page,
    methods_table,
    plain,
    requirement_lines,
)
from oneshotfl.cli.main import app
from oneshotfl.methods import METHODS
from oneshotfl.params import attribute_docs
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
    assert lines[start + len(words)].startswith("cost in the number of clients n: ")
    assert lines[start + len(words) + 1].startswith("hyper-parameters")
    assert "Requires(" not in text  # in words, never the dataclass's repr
    for f in dataclasses.fields(cls.Config):
        assert any(line.startswith(f"  {f.name} = ") for line in lines), f.name


@pytest.mark.parametrize("name", METHODS.names())
def test_every_knob_of_every_method_is_described_in_its_config_docstring(name: str) -> None:
    """The words of a hyper-parameter live once, in the ``Attributes:`` section of its
    ``Config`` (or of the base class that declares it); a knob without words fails here."""
    config = METHODS.get(name).Config
    words = attribute_docs(config)
    missing = [f.name for f in dataclasses.fields(config) if not words.get(f.name, "").strip()]
    assert not missing, f"{config.__qualname__}: no Attributes: entry for {missing}"
    text = describe_method(name)
    for knob in describe(name).knobs:  # and `oneshotfl describe` prints them beneath the knob
        assert plain(knob.words).split()[0] in text.split(f"  {knob.name} = ", 1)[1]


def test_attribute_docs_walk_the_bases_and_stop_at_the_section_end() -> None:
    from oneshotfl.methods.intactofl import IntactOFLConfig

    words = attribute_docs(IntactOFLConfig)
    assert words["width"].startswith("ngf")  # declared and described by SynthesisBudget
    assert words["mixture"].endswith('(Eq. 7\'s "outputs" read as softmax outputs).')
    assert "SynthesisBudget" not in words["mixture"]  # the paragraph after the section


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
    for knob in d.knobs:  # a table row per knob: its default and its words, as the command's
        row = next(line for line in page.splitlines() if line.startswith(f"| `{knob.name}` |"))
        assert f"`{knob.default}`" in row and knob.words.split("``")[-1].strip() in row
        assert f"  {knob.name} = {knob.default}" in d.settings
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
    return load_script(ROOT / "scripts/mkdocs_hooks.py")


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


def _unresolved_links(site: Path) -> list[str]:
    """Every internal ``href``/``src`` of every built page that does not name a file on disk
    (a folder, whose ``file://`` link a browser shows as a listing, counts as unresolved), and
    every ``#anchor`` its target page lacks. ``404.html`` is left out: only a web server shows
    it, and its links are absolute to the server's root on purpose."""
    ids: dict[Path, set[str]] = {}
    bad = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":
            continue
        for link in re.findall(r'(?:href|src)="([^"]*)"', page.read_text(encoding="utf-8")):
            if not link or re.match(r"^[a-z][a-z0-9+.-]*:|^//", link):
                continue  # another site, mailto:, data:
            path, _, anchor = link.partition("#")
            path = unquote(path.split("?")[0])
            target = (page.parent / path).resolve() if path else page
            if path.startswith("/") or not target.is_file():
                bad.append(f"{page.relative_to(site)}: {link}")
                continue
            if anchor and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text("utf-8")))
                if unquote(anchor) not in ids[target]:
                    bad.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    return bad


def _build_site(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkdocs build --strict --site-dir SITE`` in the repository, in this process (what the
    command runs); a warning aborts it (strict), failing the test with mkdocs's log."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    logger = logging.getLogger("mkdocs")
    level, records = logger.level, _Records()
    logger.setLevel(logging.INFO)  # as the command does: no warning is filtered out
    logger.addHandler(records)
    cfg = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(site))
    assert cfg.strict
    cfg.plugins.on_startup(command="build", dirty=False)
    try:
        build(cfg)
    except Abort as exc:
        pytest.fail(f"{exc}\n" + "\n".join(records.lines))
    finally:
        cfg.plugins.on_shutdown()
        logger.removeHandler(records)
        logger.setLevel(level)


class _Records(logging.Handler):
    """The warnings and errors of a build, as lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def test_the_site_builds_strictly_and_works_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strict build, a page per method and per topic, and the from-disk property: every
    internal link of every page names a file (``use_directory_urls: false``), so the site
    opened as ``site/index.html`` never lands on a folder's listing. The headless-browser
    check of the same, from disk and served, is ``scripts/check_site.py``."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    _build_site(site, monkeypatch)
    for name in METHODS.names():
        assert (site / "methods" / f"{name}.html").is_file(), name
    topics = ("getting-started", "own-data", "tracking", "plugins", "python-api", "deploy")
    for page in (*topics, "adding-a-method", "security", "benchmarks/index"):
        assert (site / f"{page}.html").is_file(), page
    for page in BENCHMARK_PAGES:
        assert (site / "benchmarks" / f"{page}.html").is_file(), page
    assert "oneshotfl.protocol.contract.Method" in (site / "api/protocol.html").read_text()
    assert (site / "search" / "search_index.js").is_file()  # search from disk (offline plugin)
    assert not _unresolved_links(site), _unresolved_links(site)[:20]
    start = (site / "getting-started.html").read_text()
    assert "--8&lt;--" not in start and "fedol-fmnist.yaml" in start  # README's quick start


BENCHMARK_PAGES = (
    "core",
    "prediction-sharing",
    "shared-encoder",
    "open-set",
    "data-free",
    "personalisation",
    "robustness",
    "security",
    "flower",
    "speed",
    "reproducibility",
)


def test_every_benchmark_writer_names_a_page_that_holds_its_markers() -> None:
    """Each report section lives in one benchmark page, and every command that splices one
    (the Makefile's ``--markdown`` and the report scripts' default page) names that page."""
    pages = {p.stem: p.read_text() for p in (ROOT / "docs" / "benchmarks").glob("*.md")}
    assert set(BENCHMARK_PAGES) <= set(pages)
    homes: dict[str, list[str]] = {}
    for stem, text in pages.items():
        for section in re.findall(r"<!-- report:([\w-]+) -->", text):
            assert f"<!-- /report:{section} -->" in text, (stem, section)
            if section != "summary":  # every page's own (scripts/page_summaries.py)
                homes.setdefault(section, []).append(stem)
    assert all(len(h) == 1 for h in homes.values()), homes
    makefile = (ROOT / "Makefile").read_text()
    spliced = re.findall(
        r"--markdown docs/benchmarks/([\w-]+)\.md \\?\s*--section ([\w-]+)", makefile
    )
    assert len(spliced) == 2  # bench-core, bench-fedeov-target
    for page, section in spliced:
        assert homes[section] == [page], (page, section)
    for script in (ROOT / "scripts").glob("*.py"):
        text = script.read_text()
        assert "docs/benchmarks.md" not in text, script.name
        for page in re.findall(r'"docs/benchmarks/([\w-]+)\.md"', text):
            assert page in pages, (script.name, page)
            written = re.findall(r'splice_markdown\((?:Path\("[^"]*"\)|\w+), "([\w-]+)"', text)
            assert all(homes.get(s) == [page] for s in written), (script.name, written)
    assert not (ROOT / "docs" / "benchmarks.md").exists()


def test_the_documented_sweep_file_is_a_valid_sweep() -> None:
    import yaml

    from oneshotfl.runner.sweep import parse_sweep

    page = (ROOT / "docs/own-data.md").read_text()
    block = page.split("<!-- sweep-example -->")[1].split("```yaml")[1].split("```")[0]
    sweep = parse_sweep(yaml.safe_load(block))
    assert sweep.name == "dirichlet-digits"
    assert len(sweep.runs) == (2 + 1) * 3 * 2  # grid points × seeds × groups
    listed = page.split("<!-- sweep-runs -->")[1].split("```text")[1].split("```")[0].split()
    assert listed == [run.run_id for run in sweep.runs]  # the folders, as parse_sweep names them


def test_benchmark_pages_open_with_the_summary_their_results_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 52: each page of ``benchmarks/summaries.yaml`` holds, before its first section,
    the summary ``scripts/page_summaries.py`` writes from the committed result files — so a
    result regenerated without its summary fails here — and each row links to a heading of
    the page."""
    import yaml

    module = load_script(ROOT / "scripts/page_summaries.py")
    monkeypatch.chdir(ROOT)
    pages = yaml.safe_load((ROOT / "benchmarks/summaries.yaml").read_text())["pages"]
    assert len(pages) >= 7
    for page in pages:
        text = (ROOT / page["page"]).read_text()
        start = text.index("<!-- report:summary -->")
        assert start < text.index("\n## "), f"{page['page']}: the summary comes first"
        body = text[start:].split("\n", 1)[1].split("<!-- /report:summary -->")[0].strip()
        assert body == module.summary(page), f"{page['page']}: run scripts/page_summaries.py"
        headings = {module.anchor(h) for h in re.findall(r"^#+ (.+?)\s*$", text, re.MULTILINE)}
        for link in re.findall(r"\]\(#([^)]+)\)", body):
            assert link in headings, f"{page['page']}: no heading for #{link}"
