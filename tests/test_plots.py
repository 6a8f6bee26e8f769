"""Plot helpers: a log axis labels the measured points without overlapping labels; a report
with a personalised method also plots personal accuracy against bytes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from oneshotfl.plots import line_plot, spaced_ticks
from oneshotfl.runner.report import collect
from oneshotfl.runner.report_plots import Report, bytes_points, report_plots


def test_spaced_ticks_drop_values_too_close_to_label_apart() -> None:
    kib = 1024.0
    values = [241.91 * kib, 242.24 * kib, 117.3 * kib, 983.0 * kib, 0.0]
    assert spaced_ticks(values) == [117.3 * kib, 241.91 * kib, 983.0 * kib]
    assert spaced_ticks([1.0, 1.1, 1.2, 1.3, 1.4]) == [1.0, 1.2, 1.4]  # ≥ 1.15 × the last kept
    assert spaced_ticks([]) == []


def test_a_log_plot_of_near_equal_uploads_is_written(tmp_path: Path) -> None:
    series = {"a": [(241.91 * 1024, 0.5, 0.0)], "b": [(242.24 * 1024, 0.6, 0.01)]}
    path = line_plot(series, tmp_path / "p.png", "bytes", "accuracy", logx=True)
    assert matplotlib.image.imread(path).shape[:2] == (504, 780)  # 6.5 × 4.2 in at 120 dpi


ROOT = Path(__file__).resolve().parents[1]


def _collect(path: Path) -> Report:
    return collect([json.loads(path.read_text())])


def test_a_report_with_a_personalised_method_also_plots_personal_accuracy(tmp_path: Path) -> None:
    run = ROOT / "benchmarks/results/fol-fmnist/psi=0.5_graph=ring_seed=0/result.json"
    doc = json.loads(run.read_text())
    personal = {m["key"]: m["personal_accuracy"] for m in doc["methods"]}
    report = _collect(run)
    points = bytes_points(report, personal=True)
    assert points["fol:rounds=3"][0][1] == pytest.approx(personal["fol:rounds=3"])
    assert "local" not in points  # it uploads nothing
    plots = report_plots(report, tmp_path, "fol")
    assert plots["personal accuracy vs upload bytes"].name == "personal_accuracy_vs_bytes.png"
    assert plots["accuracy vs upload bytes"].exists()

    global_only = _collect(ROOT / "examples/digits-row/result.json")  # `local` is personalised
    assert any(c.personalised for c in global_only.cells.values())  # but uploads nothing
    assert "personal accuracy vs upload bytes" not in report_plots(global_only, tmp_path, "g")


def test_the_upload_plot_shows_the_spread_of_the_seeds_of_one_setting() -> None:
    """One setting run with two seeds: the point's error bar is the seeds' spread (it was the
    spread over settings: zero, on a y axis squeezed around the mean)."""
    doc = json.loads((ROOT / "examples/digits-row/result.json").read_text())
    second = json.loads(json.dumps(doc))
    second["config"]["seed"] = 1
    for m in second["methods"]:
        m["accuracy"] = m["accuracy"] - 0.1
    report = collect([doc, second])
    fedavg = next(m["accuracy"] for m in doc["methods"] if m["key"] == "fedavg")
    ((_, mean, spread),) = bytes_points(report, personal=False)["fedavg"]
    assert mean == pytest.approx(fedavg - 0.05)
    # the 95% half-width of two runs 0.1 apart: t(0.975, 1) · std (0.1 / √2) / √2
    assert spread == pytest.approx(12.7062047 * 0.1 / 2**0.5 / 2**0.5, rel=1e-6)
