"""``method_defaults``: knobs beneath a method's spec for one run (how committed benchmarks keep
the defaults they were recorded with when a later version changes them)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import run_config
from oneshotfl.runner.checks import resolve_methods
from oneshotfl.runner.compare import config_differences
from oneshotfl.runner.config import ConfigError, make_config
from oneshotfl.runner.results import recorded_config
from oneshotfl.runner.sweep import load_sweep

OLD_FEDEOV = "fedeov:accepted_votes=none:fgsm_step=0.002:fgsm_steps=15:fgsm_warmup_steps=5"


def test_defaults_sit_beneath_the_spec_and_the_key_is_the_spec_as_written() -> None:
    (key, plain), (key2, voted) = resolve_methods(
        ["fedeov", "fedeov:accepted_votes=3"], [OLD_FEDEOV]
    )
    assert (key, key2) == ("fedeov", "fedeov:accepted_votes=3")
    assert (plain.config.fgsm_steps, plain.config.fgsm_step, plain.config.accepted_votes) == (
        15,
        0.002,
        None,
    )
    assert (voted.config.fgsm_steps, voted.config.accepted_votes) == (15, 3)
    ((_, today),) = resolve_methods(["fedeov"])
    assert (today.config.fgsm_steps, today.config.accepted_votes) == (3, 5)


@pytest.mark.parametrize(
    ("defaults", "fragment"),
    [
        (["fedeovv:fgsm_steps=3"], "method_defaults: unknown method 'fedeovv' (did you mean"),
        (["fedeov:fgsm_steps=3", "fedeov:grid=2"], "expected each method once, got 'fedeov'"),
        (["fedeov:fgsm_steps"], "expected key=value"),
        (["fedeov:fgsm_steps=0"], "fgsm_steps"),
    ],
)
def test_bad_defaults_are_one_line_errors(defaults: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        resolve_methods(["fedeov"], defaults)


def test_a_run_with_defaults_equals_the_run_with_the_knob_in_its_spec(tiny_config: Any) -> None:
    pinned = run_config(
        tiny_config(methods=["ensemble"], method_defaults="ensemble:combine=logits")
    )
    spelled = run_config(tiny_config(methods=["ensemble:combine=logits"]))
    plain = run_config(tiny_config(methods=["ensemble"]))
    assert pinned["methods"][0]["key"] == "ensemble"
    assert pinned["methods"][0]["params"] == spelled["methods"][0]["params"]
    assert pinned["methods"][0]["params"] != plain["methods"][0]["params"]
    assert pinned["methods"][0]["accuracy"] == spelled["methods"][0]["accuracy"]
    assert pinned["config"]["method_defaults"] == ["ensemble:combine=logits"]


def test_a_comparison_counts_only_the_defaults_of_methods_that_ran(tiny_config: Any) -> None:
    doc = {"config": tiny_config(methods=["fedavg"]).to_dict()}
    other = copy.deepcopy(doc)
    other["config"]["method_defaults"] = ["fedeov:fgsm_steps=15"]  # fedeov did not run
    assert config_differences(doc, other) == []
    other["config"]["methods"] = doc["config"]["methods"] = ["fedeov"]
    assert config_differences(doc, other) == [
        "method_defaults: [] before, ['fedeov:fgsm_steps=15'] after"
    ]


def test_a_result_from_before_the_key_ran_fedeov_with_its_old_defaults() -> None:
    old = {"methods": ["fedeov", "fedavg"], "dataset": "digits"}  # no method_defaults
    assert recorded_config(old).method_defaults == (
        OLD_FEDEOV,  # only the pins of the methods it ran
    )
    assert recorded_config({"methods": ["fedavg"], "dataset": "digits"}).method_defaults == ()
    pinned = {**old, "method_defaults": [OLD_FEDEOV]}
    assert config_differences({"config": old}, {"config": pinned}) == []


def test_yaml_and_overrides_take_the_forms_methods_take() -> None:
    listed = make_config({"method_defaults": [{"name": "fedeov", "fgsm_steps": 15}]})
    assert listed.method_defaults == ("fedeov:fgsm_steps=15",)
    assert make_config({"method_defaults": "fedeov:fgsm_steps=15,fedov:fgsm_steps=1"})
    assert make_config({"method_defaults": None}).method_defaults == ()
    with pytest.raises(ConfigError, match="method_defaults: expected a list"):
        make_config({"method_defaults": 3})


def test_every_committed_benchmark_row_reruns_with_the_knobs_it_recorded() -> None:
    """Each committed sweep's YAML, resolved today, builds every method of its committed
    results with the knobs those results recorded (a knob added later, absent from a record,
    is not compared): a changed default must be pinned in the YAMLs that ran it."""
    root = Path(__file__).resolve().parents[1]
    checked, wrong = 0, []
    for path in sorted((root / "benchmarks").glob("*.yaml")):
        if "grid" not in (yaml.safe_load(path.read_text()) or {}):
            continue  # a single-run config (memory, membership audit), not a sweep
        sweep = load_sweep(path)
        for run in sweep.runs:
            result = root / "benchmarks" / "results" / sweep.name / run.run_id / "result.json"
            if not result.exists():
                continue
            built = dict(resolve_methods(run.config.methods, run.config.method_defaults))
            for row in json.loads(result.read_text())["methods"]:
                now = dataclasses.asdict(built[row["key"]].config)
                for knob, value in row["params"].items():
                    checked += 1
                    if knob in now and now[knob] != value:
                        wrong.append(f"{sweep.name}/{run.run_id} {row['key']} {knob}")
    assert checked > 1000 and not wrong, wrong[:5]
