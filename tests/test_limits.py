"""Known limits (``Method.known_limits``): what they cover, that ``describe`` prints them, and
the robustness report's use of them — a cell below a reference is explained only by a limit
that covers it (and whose bound is below there too); an unexplained one fails ``--check``."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from helpers import load_script
from oneshotfl.cli.describe import describe_method
from oneshotfl.methods import METHODS
from oneshotfl.protocol.limits import KnownLimit

ROOT = Path(__file__).parents[1]


def test_a_limit_covers_only_its_scope() -> None:
    limit = KnownLimit(
        "why", below=("ensemble",), datasets=("digits",), partitions=("disjoint",),
        options=("combine=logits",),
    )  # fmt: skip
    assert limit.covers("ensemble", "digits", "cnn", "disjoint", "combine=logits:x=1")
    assert not limit.covers("local", "digits", "cnn", "disjoint", "combine=logits")
    assert not limit.covers("ensemble", "shapes16", "cnn", "disjoint", "combine=logits")
    assert not limit.covers("ensemble", "digits", "cnn", "dirichlet", "combine=logits")
    assert not limit.covers("ensemble", "digits", "cnn", "disjoint", "")  # option not set
    assert "below ensemble; digits; every model; disjoint" in limit.scope()
    with pytest.raises(ValueError, match=r"KnownLimit\.below"):
        KnownLimit("why", below=("oracle",))  # type: ignore[arg-type]


def test_describe_prints_a_methods_known_limits() -> None:
    text = describe_method("fedavg")
    assert "known limits" in text
    for limit in METHODS.get("fedavg").known_limits:
        assert limit.why[:40] in text


def _report() -> ModuleType:
    return load_script(ROOT / "scripts" / "robustness_report.py")


def _run(root: Path, name: str, dataset: str, partition: str, acc: dict[str, float]) -> None:
    doc = {
        "config": {"dataset": dataset, "model": "cnn", "partition": partition},
        "methods": [{"key": k, "accuracy": v} for k, v in acc.items()],
    }
    (root / name).mkdir(parents=True)
    (root / name / "result.json").write_text(json.dumps(doc))


def test_the_report_explains_flags_by_limits_and_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report()
    runs = tmp_path / "robustness"  # the folder's name names the markers and the figure
    # fedage below the ensemble: explained where its bound (centralized_head) is below too
    _run(runs, "a", "digits", "dirichlet", {"local": 0.5, "ensemble": 0.8, "fedage": 0.6,
                                            "centralized_head": 0.7})  # fmt: skip
    _run(runs, "b", "digits", "iid", {"local": 0.5, "ensemble": 0.8, "fedage": 0.6,
                                      "centralized_head": 0.9})  # fmt: skip
    table = report.load(runs)
    found = report.flags(table)
    by_cell = {(f.method, f.cell.partition, f.reference): f for f in found}
    assert by_cell[("fedage", "dirichlet", "ensemble")].limit is not None
    assert by_cell[("fedage", "iid", "ensemble")].limit is None  # its bound is not below
    assert ("centralized_head", "dirichlet", "ensemble") in by_cell
    marks = report.matrix_tables(table, found)
    assert "60.0 ✗" in marks  # the unexplained cell is marked as such
    markdown = tmp_path / "benchmarks" / "robustness.md"  # as docs/benchmarks/robustness.md
    markdown.parent.mkdir()
    markdown.write_text("<!-- report:robustness -->\n<!-- /report:robustness -->\n")
    rc = report.main([str(runs), str(markdown), "--check"])
    assert rc == 1 and "fedage" in markdown.read_text()
    printed = capsys.readouterr().out
    assert "unexplained: fedage on digits · cnn · iid" in printed
    assert "unexplained: fedage on digits · cnn · dirichlet" not in printed
    assert (tmp_path / "figures" / "robustness" / "matrix.png").is_file()


def _clients(root: Path, name: str, means: dict[str, float]) -> None:
    rows = ["method,client,local_test_accuracy,local_val_accuracy"]
    for key, mean in means.items():
        rows += [f"{key},0,{mean - 0.05},0.5", f"{key},1,{mean + 0.05},0.5"]
    (root / name / "local.csv").write_text("\n".join(rows) + "\n")


def test_a_weak_clients_limit_covers_only_where_the_clients_are_weaker(tmp_path: Path) -> None:
    report = _report()
    runs = tmp_path / "runs"
    acc = {"local": 0.5, "ensemble": 0.8, "fedage": 0.6, "centralized_head": 0.9}
    _run(runs, "a", "digits", "iid", acc)
    _clients(runs, "a", {"local": 0.9, "fedage": 0.8})  # heads 10 points below the models
    _run(runs, "b", "digits", "dirichlet", acc)
    _clients(runs, "b", {"local": 0.9, "fedage": 0.9})  # heads as good: not the cause here
    table = report.load(runs)
    assert table[report.Cell("digits", "cnn", "iid")]["fedage@clients"] == pytest.approx(80.0)
    by_cell = {(f.method, f.cell.partition): f for f in report.flags(table)}
    covering = by_cell[("fedage", "iid")].limit
    assert covering is not None and covering.weak_clients
    assert by_cell[("fedage", "dirichlet")].limit is None
    assert "where its client models are below `local`'s" in covering.scope()


def test_the_budget_comparison_lines_a_method_up_across_its_options(tmp_path: Path) -> None:
    report = _report()
    cut, full = tmp_path / "robustness", tmp_path / "robustness-full"
    refs = {"local": 0.5, "ensemble": 0.8, "ensemble:combine=logits": 0.7}
    _run(cut, "a", "digits", "dirichlet", {**refs, "fedkt:partitions=1": 0.6})
    _run(full, "a", "digits", "dirichlet", {**refs, "fedkt": 0.9})
    text = report.budget_comparison(report.load(cut), report.load(full), "robustness-full")
    assert "1 (method, cell) pairs change" in text  # fedkt: flagged here, not there
    assert "| `fedkt` | 60.0 | 90.0 | -30.0 | 30.0 | 1 | 0 |" in text
    assert "| `ensemble:combine=logits` | 70.0 | 70.0 | +0.0 | 0.0 | 1 | 1 |" in text
    markdown = tmp_path / "benchmarks" / "robustness.md"  # its heatmap goes to ../figures/
    markdown.parent.mkdir()
    markdown.write_text("<!-- report:robustness -->\n<!-- /report:robustness -->\n")
    report.main([str(cut), str(markdown), "--against", str(full)])
    assert "| `fedkt` | 60.0 | 90.0 |" in markdown.read_text()
