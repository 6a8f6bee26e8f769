"""Intervals over seeds (oneshotfl.intervals), the report's paired table and the claims rule
(scripts/claims_report.py) on result files the test writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from helpers import load_script
from oneshotfl.intervals import (
    claim_verdict,
    difference_words,
    mean_interval,
    paired_difference,
)
from oneshotfl.runner.report import collect
from oneshotfl.runner.report_tables import paired_rows, paired_table, reference_method

ROOT = Path(__file__).resolve().parents[1]


def test_mean_interval_is_the_student_t_interval() -> None:
    values = [0.61, 0.58, 0.66, 0.63, 0.60]
    found = mean_interval(values)
    low, high = stats.t.interval(0.95, 4, loc=sum(values) / 5, scale=stats.sem(values))
    assert found.available and found.n == 5
    assert found.low == pytest.approx(low, abs=1e-12)
    assert found.high == pytest.approx(high, abs=1e-12)
    assert mean_interval(values, level=0.9).half_width < found.half_width


def test_fewer_than_two_values_give_no_interval_and_say_why() -> None:
    one = mean_interval([0.7])
    assert not one.available and one.n == 1 and one.mean == 0.7
    assert math.isnan(one.low) and math.isnan(one.half_width)
    assert "1 seed" in (one.reason or "")
    assert one.text() == "0.70 (CI n/a)" and "n/a" in one.bracket()
    none = mean_interval([])
    assert not none.available and none.n == 0 and none.bracket() == "n/a"
    assert claim_verdict(one, 1.0) == "inconclusive"  # never a verdict on one seed
    assert difference_words(one) == "n/a"  # no interval: no claim either way
    with pytest.raises(ValueError, match="level"):
        mean_interval([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match="finite"):
        mean_interval([1.0, float("nan")])


def test_paired_difference_pairs_by_seed_and_is_tighter_than_the_separate_intervals() -> None:
    # the federation of each seed moves both methods; b is a steady 2 points above a
    a = {0: 60.0, 1: 70.0, 2: 55.0, 3: 65.0, 4: 58.0}
    b = {4: 60.1, 3: 66.9, 2: 57.2, 1: 71.8, 0: 62.0, 9: 99.0}  # seed 9: a never ran it
    found, seeds = paired_difference(a, b)
    assert seeds == [0, 1, 2, 3, 4]
    assert found.mean == pytest.approx(-2.0, abs=1e-9)
    assert found.high < 0 and difference_words(found) == "lower"
    separate = mean_interval(a.values()).half_width + mean_interval(list(b.values())[:5]).half_width
    assert found.half_width < separate / 10


@pytest.mark.parametrize(
    ("values", "margin", "verdict"),
    [
        ([5.0, 6.0, 5.5, 6.5, 5.8], 8.0, "holds"),  # lower end ≥ 4 = half the paper's 8
        ([2.0, 3.0, 2.5, 3.5, 2.8], 8.0, "in direction"),  # above 0, below half the margin
        ([-2.0, -3.0, -2.5, -3.5, -2.8], 8.0, "fails"),  # upper end below 0
        ([-2.0, 3.0, 1.0, -1.0, 0.5], 8.0, "inconclusive"),  # the interval holds 0
        ([2.0, 3.0, 2.5, 3.5, 2.8], None, "holds"),  # a claim of direction only
    ],
)
def test_the_claims_rule_reads_the_interval(
    values: list[float], margin: float | None, verdict: str
) -> None:
    assert claim_verdict(mean_interval(values), margin) == verdict


def _doc(seed: int, accuracies: dict[str, float]) -> dict[str, Any]:
    return {
        "config": {"partition": "dirichlet", "alpha": 0.5, "seed": seed},
        "methods": [
            {"key": k, "accuracy": v, "upload_bytes_mean": 10.0} for k, v in accuracies.items()
        ],
    }


def test_the_report_pairs_each_method_with_the_baseline_on_the_same_seeds() -> None:
    docs = [
        _doc(0, {"fedavg": 0.50, "ensemble": 0.60, "local": 0.40}),
        _doc(1, {"fedavg": 0.70, "ensemble": 0.81, "local": 0.71}),
        _doc(2, {"fedavg": 0.60, "ensemble": 0.69}),  # local did not run on seed 2
    ]
    report = collect(docs)
    assert reference_method(report) == "fedavg"
    rows = {r["method"]: r for r in paired_rows(report, "fedavg")}
    assert rows["ensemble"]["seeds"] == 3
    assert rows["ensemble"]["difference_mean"] == pytest.approx(10.0)
    assert rows["ensemble"]["verdict"] == "higher"
    assert rows["local"]["seeds"] == 2  # only the seeds both ran
    assert rows["local"]["verdict"] == "no measurable difference"
    table = paired_table(report, "fedavg")
    assert "| minus `fedavg` |" in table and "(no measurable difference)" in table
    with pytest.raises(ValueError, match="expected --baseline to be one of"):
        reference_method(report, "fedol")
    one = collect([_doc(0, {"fedavg": 0.5})])
    assert reference_method(one) is None
    # a method that only failed is no baseline: it has nothing to pair
    failed = [
        {**_doc(s, {"ensemble": 0.6 + s / 100, "local": 0.4}), "failed_methods": {"fedlpa": "x"}}
        for s in (0, 1)
    ]
    assert collect(failed).methods[0] == "fedlpa"
    assert reference_method(collect(failed)) == "ensemble"


def _paired_module() -> Any:
    return load_script(ROOT / "scripts/paired.py", "paired_script")


def _claims_module() -> Any:
    return load_script(ROOT / "scripts/claims_report.py")


def test_claims_rows_judge_the_paired_interval_and_a_missing_row_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = _claims_module()
    results = tmp_path / "results"
    for seed, (a, b) in enumerate([(0.71, 0.60), (0.74, 0.62), (0.69, 0.59), (0.72, 0.61)]):
        run = results / "bench" / f"cell=x_seed={seed}"
        run.mkdir(parents=True)
        doc = {"methods": [{"key": "a", "accuracy": a}, {"key": "b", "accuracy": b}]}
        (run / "result.json").write_text(json.dumps(doc))
    monkeypatch.setattr(claims, "RESULTS", results)
    setting = {"label": "x", "bench": "bench", "cell": "cell=x", "a": "a", "b": "b"}
    head = {"id": "T1", "paper": "P", "claim": "a beats b", "paper_number": "+10", "nearest": ""}
    row = claims.evaluate({**head, "paper_values": [10.0], "settings": [setting]})
    assert row["verdict"] == "holds" and row["fewest_seeds"] == 4  # lower end ≥ 5 points
    assert row["settings"][0]["n"] == 4
    gone = claims.evaluate({**head, "paper_values": [10.0], "settings": [{**setting, "cell": "y"}]})
    assert gone["verdict"] == "missing results" and "expected results at" in gone["missing"]
    text = claims.table([row, gone])
    assert "fewer than 5 seeds" in text and "result files missing" in text
    parity = claims.evaluate({**head, "kind": "no_worse", "tol": 1.0, "settings": [setting]})
    assert parity["verdict"] == "holds"


def test_claim_seeds_pair_with_the_full_seeds_and_the_best_is_chosen_on_the_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's claim seeds run a claim's pair alone (issue 51): those seeds pair with the
    full ones, the best of ``best_of`` is chosen on the seeds every option ran, and a method
    the run was configured with but did not report is an error, not a skipped seed."""
    claims = _claims_module()
    results = tmp_path / "results"
    full = {"a": [0.70, 0.72, 0.71], "b": [0.60, 0.61, 0.62], "c": [0.64, 0.66, 0.65]}
    claim = {"a": [0.73, 0.70]}  # c at 0.30 on these: over all its seeds below b, not on 0-2

    def write(seed: int, values: dict[str, float], configured: list[str]) -> None:
        run = results / "bench" / f"cell=x_seed={seed}"
        run.mkdir(parents=True, exist_ok=True)
        doc = {"config": {"methods": configured},
               "methods": [{"key": k, "accuracy": v} for k, v in values.items()]}  # fmt: skip
        (run / "result.json").write_text(json.dumps(doc))

    for seed in range(3):
        write(seed, {k: v[seed] for k, v in full.items()}, ["a", "b", "c"])
    for seed in (3, 4):
        write(seed, {"a": claim["a"][seed - 3], "c": 0.30}, ["a", "c"])
    monkeypatch.setattr(claims, "RESULTS", results)
    head = {"id": "T2", "paper": "P", "claim": "a beats the best", "paper_number": "+4",
            "nearest": "", "paper_values": [4.0]}  # fmt: skip
    setting = {"label": "x", "bench": "bench", "cell": "cell=x", "a": "a", "best_of": ["b", "c"]}
    row = claims.evaluate({**head, "settings": [setting]})
    assert row["settings"][0]["against"] == "c" and row["fewest_seeds"] == 5
    assert claims.series("bench", "cell=x", "b", "accuracy") == pytest.approx(
        {0: 60.0, 1: 61.0, 2: 62.0}
    )
    for seed in (3, 4):  # b configured at a claim seed but not reported: a broken file
        write(seed, {"a": claim["a"][seed - 3], "c": 0.30}, ["a", "b", "c"])
    with pytest.raises(ValueError, match="expected method 'b'"):
        claims.series("bench", "cell=x", "b", "accuracy")


def test_times_are_ratios_over_seeds_without_the_authors_evaluation(tmp_path: Path) -> None:
    """``scripts/paired.py times`` (issue 51: our time at most a third of the authors'): the
    geometric mean of per-seed ratios, the authors' evaluation seconds left out, the client
    step only where both trained their clients, and "n/a" with its reason on one seed."""
    paired = _paired_module()
    for seed, (ours, theirs) in enumerate([(1.0, 4.0), (2.0, 8.0), (1.5, 6.0)]):
        run = tmp_path / f"seed={seed}"
        run.mkdir()
        methods = [
            {"key": "x", "server_wall_s": ours, "client_wall_s_mean": 0.0001},
            {"key": "y", "server_wall_s": theirs + 30.0, "client_wall_s_mean": 2.0,
             "diagnostics": {"authors_evaluation_s": 30.0}},
        ]  # fmt: skip
        config = {"partition": "iid", "seed": seed}
        (run / "result.json").write_text(json.dumps({"config": config, "methods": methods}))
    text = paired.times_table(tmp_path, ["x / y"])
    rows = [line for line in text.splitlines() if "`x` / `y`" in line]
    assert len(rows) == 1 and "| server | 3 |" in rows[0]  # no client row: x's were cached
    assert "0.25× [0.25, 0.25]" in rows[0] and rows[0].endswith("| yes |")
    one = tmp_path / "one"
    (tmp_path / "seed=0").rename(one)
    assert "n/a: 1 seed" in paired.times_table(one, ["x / y"])


def test_paired_runs_of_one_setting_pair_across_config_schemas(tmp_path: Path) -> None:
    """A seed recorded before a knob existed (its config lacks the key) pairs with the seeds
    recorded after, as ``oneshotfl report`` merges them; a key that differs separates."""
    paired = _paired_module()
    for seed, clients, extra in ((0, 5, {}), (1, 5, {"init": "torch"}), (2, 5, {"init": "torch"}),
                                 (0, 9, {"init": "torch"}), (1, 9, {"init": "torch"})):  # fmt: skip
        run = tmp_path / f"clients={clients}_seed={seed}"
        run.mkdir()
        methods = [{"key": "x", "accuracy": 0.5 + 0.01 * seed}, {"key": "y", "accuracy": 0.4}]
        config = {"partition": "iid", "seed": seed, "clients": clients, **extra}
        (run / "result.json").write_text(json.dumps({"config": config, "methods": methods}))
    rows = [
        r for r in paired.methods_table(tmp_path, ["x - y"], "accuracy").splitlines() if "`x`" in r
    ]
    assert len(rows) == 2
    assert "clients=5 | `x` − `y` | 3 | +11.00 [" in rows[0] + rows[1]
    assert "clients=9 | `x` − `y` | 2 |" in rows[0] + rows[1]


def test_claims_command_answers_help_and_bad_arguments_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = _claims_module()
    claims.main(["claims_report.py", "--help"])
    assert "Usage: python scripts/claims_report.py" in capsys.readouterr().out
    for argv, message in (
        (["x.yaml", "page.md", "more"], "expected [CLAIMS_YAML] [MARKDOWN]"),
        (["--x"], "expected [CLAIMS_YAML] [MARKDOWN]"),
        ([str(tmp_path / "none.yaml")], "expected a claims file at"),
    ):
        with pytest.raises(SystemExit) as stop:
            claims.main(["claims_report.py", *argv])
        assert message in str(stop.value)
