"""Comparing result documents: what must be identical between two runs, and the before/after
comparison of two folders of runs (with methods whose change is intended)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from helpers import run_config
from oneshotfl.runner.compare import UNUSED_LOCAL, compare_trees, result_differences


def _write(root: Path, run: str, doc: dict[str, Any]) -> None:
    (root / run).mkdir(parents=True)
    (root / run / "result.json").write_text(json.dumps(doc))


def test_differences_name_the_method_the_field_and_both_values(tiny_config: Any) -> None:
    doc = run_config(tiny_config(methods=["local", "fedavg"], val_fraction=0.2))
    assert result_differences(doc, copy.deepcopy(doc)) == []
    other = copy.deepcopy(doc)
    other["methods"][1]["accuracy"] += 0.01
    other["clients"][0]["train_size"] += 1
    diffs = result_differences(doc, other, ("here", "there"))
    assert any(d.startswith("fedavg.accuracy:") and "here" in d and "there" in d for d in diffs)
    assert any(d.startswith("client 0.train_size") for d in diffs)
    other["methods"] = other["methods"][:1]
    assert result_differences(doc, other)[0].startswith("methods:")


def test_a_file_from_before_the_typed_results_is_compared_by_its_local_accuracies(
    tiny_config: Any,
) -> None:
    new = run_config(tiny_config(methods=["local", "fedavg"]))
    old = copy.deepcopy(new)
    for m in old["methods"]:
        m.pop("local_test_accuracy", None)
        m.pop("client_personal_accuracy", None)
    for c, acc in zip(old["clients"], new["methods"][0]["local_test_accuracy"], strict=True):
        c["local_test_accuracy"] = acc
    assert result_differences(old, new) == []
    old["clients"][0]["local_test_accuracy"] = 0.0
    assert result_differences(old, new)[0].endswith(UNUSED_LOCAL)


def test_legacy_local_accuracies_no_method_reports_are_an_intended_difference(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Before issue 10 every run trained (and reported) one plain local model per client, used
    or not; after it, a run reports its methods' own local models, on purpose."""
    new = run_config(tiny_config(methods=["ensemble"]))
    new = copy.deepcopy(new)
    for m in new["methods"]:
        m.pop("local_test_accuracy", None)
        m.pop("local_val_accuracy", None)
    old = copy.deepcopy(new)
    for c in old["clients"]:
        c["local_test_accuracy"] = 0.5
    diffs = result_differences(old, new)
    assert len(diffs) == 1 and diffs[0].endswith(UNUSED_LOCAL)
    _write(tmp_path / "a", "seed=0", old)
    _write(tmp_path / "b", "seed=0", new)
    report = compare_trees(tmp_path / "a", tmp_path / "b")
    assert report["runs"]["seed=0"] == [] and report["summary"]["runs_identical"] == 1
    assert report["changed_as_intended"]["seed=0"] == diffs


def test_trees_pair_runs_by_path_and_set_intended_changes_apart(
    tiny_config: Any, tmp_path: Path
) -> None:
    doc = run_config(tiny_config(methods=["fedavg", "ensemble:weighting=size"]))
    changed = copy.deepcopy(doc)
    changed["methods"][1]["accuracy"] += 0.5
    _write(tmp_path / "a", "seed=0", doc)
    _write(tmp_path / "b", "seed=0", changed)
    _write(tmp_path / "a", "seed=1", doc)
    report = compare_trees(tmp_path / "a", tmp_path / "b")
    assert report["runs"]["seed=1"] == ["missing after"]
    assert report["runs"]["seed=0"] and report["summary"]["method_rows_identical"] == 1
    report = compare_trees(tmp_path / "a", tmp_path / "b", changed=["ensemble"])
    assert report["runs"]["seed=0"] == []
    assert report["changed_as_intended"]["seed=0"][0].startswith("ensemble:weighting=size.")


def test_the_command_says_the_configs_differ_and_how_many_differences_it_left_out(
    tiny_config: Any, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app
    from oneshotfl.runner.compare import config_differences

    doc = run_config(tiny_config(methods=["local", "fedavg"]))
    other = copy.deepcopy(doc)
    other["config"]["alpha"] = 0.1
    other["config"]["workers"] = 7  # execution only: never a difference
    for row in other["methods"]:
        row["accuracy"] += 0.01
        row["upload_bytes_mean"] += 1
        row["personal_accuracy"] += 0.01
    for client in other["clients"]:
        client["train_size"] += 1
    assert config_differences(doc, other) == ["alpha: 1.0 before, 0.1 after"]
    _write(tmp_path, "a", doc)
    _write(tmp_path, "b", other)
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 1
    assert "the configs differ in alpha: 1.0 before, 0.1 after" in result.output
    assert "more difference(s)" in result.output
    assert "compared 1 run(s): 0 identical, 1 differ" in result.output and "{" not in result.output


def test_the_command_says_when_two_runs_ran_on_other_kernels(
    tiny_config: Any, tmp_path: Path
) -> None:
    """Issue 34: a difference between runs on two CPUs is float-kernel noise, and the command
    says so; between runs on the same kernels it says nothing of the kind."""
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    doc = run_config(tiny_config(methods=["fedavg"]))
    elsewhere = copy.deepcopy(doc)
    elsewhere["environment"]["isa"] = "ANOTHER-ISA"
    elsewhere["methods"][0]["accuracy"] += 0.01
    for name, other in (("same", doc), ("other", elsewhere)):
        _write(tmp_path, name, other)
    _write(tmp_path, "ref", doc)
    runner = CliRunner()
    same = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "same")])
    assert same.exit_code == 0 and "other kernels" not in same.output
    other = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "other")])
    assert other.exit_code == 1
    said = " ".join(other.output.split())  # the console wraps long lines
    assert "ran on other kernels (isa:" in said and "'ANOTHER-ISA' here" in said
