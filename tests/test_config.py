"""Configuration: YAML, overrides, architecture lists and mappings, clear errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from oneshotfl.runner.config import (
    ConfigError,
    ExperimentConfig,
    client_architectures,
    load_config,
    make_config,
)
from oneshotfl.runner.sweep import parse_sweep


def test_yaml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "dataset: digits\nlocal-epochs: 2\nmethods:\n  - local\n"
        "  - {name: ensemble, weighting: size}\nmodel: [cnn, mlp]\n"
    )
    cfg = load_config(path, ["alpha=0.05", "clients=4", "partition_seed=9"])
    assert cfg.dataset == "digits" and cfg.local_epochs == 2 and cfg.alpha == 0.05
    assert cfg.methods == ("local", "ensemble:weighting=size")
    assert client_architectures(cfg.model, cfg.clients) == ("cnn", "mlp", "cnn", "mlp")
    assert cfg.data_seed == 9 and cfg.seed == 0


def test_architecture_mapping() -> None:
    assert client_architectures("0=resnet8,2=mlp,*=cnn", 4) == ("resnet8", "cnn", "mlp", "cnn")
    with pytest.raises(ConfigError, match="client 1 has no architecture"):
        client_architectures("0=resnet8", 2)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"clinets": 3}, "unknown config key 'clinets'"),
        ({"clients": 0}, "clients: expected >= 1, got 0"),
        ({"val_fraction": 1.5}, "val_fraction"),
        ({"alpha": "lots"}, "alpha"),
        ({"device": "tpu"}, "device"),
        ({"lr": -1}, "lr: expected > 0"),
        ({"min_clients": 20, "clients": 10}, "min_clients"),
    ],
)
def test_bad_values_name_expected_and_got(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        make_config(values)


def test_missing_or_invalid_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_sweep_expands_subgrids_times_seeds() -> None:
    sweep = parse_sweep(
        {
            "name": "s",
            "base": {"dataset": "digits"},
            "grid": [
                {"partition": "dirichlet", "alpha": [0.1, 0.5]},
                {"partition": "pathological", "classes_per_client": 2},
            ],
            "seeds": [0, 1],
        }
    )
    assert len(sweep.runs) == 6
    ids = [r.run_id for r in sweep.runs]
    assert ids[0] == "partition=dirichlet_alpha=0.1_seed=0"
    assert len(set(ids)) == 6
    assert all(isinstance(r.config, ExperimentConfig) for r in sweep.runs)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_sweep({"grdi": []})


def test_report_keeps_runs_that_differ_in_more_than_the_seed_apart() -> None:
    from oneshotfl.runner.report import collect

    def doc(clients: int, seed: int, acc: float) -> dict[str, object]:
        config = {"partition": "dirichlet", "alpha": 0.1, "clients": clients, "seed": seed}
        return {
            "config": config,
            "methods": [{"key": "fedavg", "accuracy": acc, "upload_bytes_mean": 10.0}],
        }

    report = collect([doc(10, 0, 0.5), doc(10, 1, 0.7), doc(20, 0, 0.1)])
    assert report.settings == ["dirichlet α=0.1 · clients=10", "dirichlet α=0.1 · clients=20"]
    cell = report.cells[("dirichlet α=0.1 · clients=10", "fedavg")]
    found = cell.interval()  # t(0.975, 1) · 0.1414 / √2: the 95% half-width of two seeds
    assert abs(found.mean - 0.6) < 1e-12 and abs(found.half_width - 1.2706) < 1e-3
    assert cell.by_seed() == {0: 0.5, 1: 0.7}


def test_sweep_groups_and_seed_order() -> None:
    from oneshotfl.runner.sweep import select_seeds

    sweep = parse_sweep(
        {
            "base": {"dataset": "digits", "methods": ["local"]},
            "grid": {"partition": "dirichlet", "alpha": [0.1, 1.0]},
            "groups": {
                "models": {"model": "mlp", "methods": ["fedavg"]},
                "predictions": {"model": "mlp,cnn", "server_model": "mlp", "methods": ["fedol"]},
            },
            "seeds": [0, 1],
        }
    )
    ids = [r.run_id for r in sweep.runs]
    assert len(ids) == 8 and len(set(ids)) == 8
    assert ids[:2] == [
        "group=models_partition=dirichlet_alpha=0.1_seed=0",
        "group=predictions_partition=dirichlet_alpha=0.1_seed=0",
    ]
    assert [r.config.seed for r in sweep.runs] == [0] * 4 + [1] * 4  # seed-major
    first, second = sweep.runs[0].config, sweep.runs[1].config
    assert (first.group, first.model, first.methods) == ("models", "mlp", ("fedavg",))
    assert (second.group, second.server_model, second.methods) == ("predictions", "mlp", ("fedol",))
    assert [r.config.seed for r in select_seeds(sweep.runs, "1")] == [1] * 4
    with pytest.raises(ConfigError, match="expected some of \\[0, 1\\]"):
        select_seeds(sweep.runs, "2")
    with pytest.raises(ConfigError, match="comma-separated integers"):
        select_seeds(sweep.runs, "a")
    with pytest.raises(ConfigError, match="groups must map"):
        parse_sweep({"groups": ["models"]})


def test_claim_seeds_run_only_the_named_methods_at_the_named_points() -> None:
    """``claim_seeds`` (issue 51): extra seeds that run a claim's pair alone, in the groups and
    grid points named, under the full seeds' run names; a method, group, point or seed the
    sweep does not have is refused before anything runs."""
    sweep = {
        "base": {"dataset": "digits"},
        "grid": {"psi": [0.7, 0.1], "graph": ["ring", "complete"]},
        "groups": {
            "models": {"model": "mlp", "methods": ["fedavg", "local"]},
            "predictions": {"model": "mlp", "methods": ["ensemble", "fedol:rounds=2"]},
        },
        "seeds": [0],
        "claim_seeds": {
            "seeds": [3, 4],
            "methods": {"predictions": ["fedol:rounds=2"]},
            "grid": [{"psi": 0.1, "graph": "ring"}],
        },
    }
    runs = parse_sweep(sweep).runs
    extra = [r for r in runs if r.config.seed > 0]
    assert [r.run_id for r in extra] == [
        "group=predictions_psi=0.1_graph=ring_seed=3",
        "group=predictions_psi=0.1_graph=ring_seed=4",
    ]
    assert all(r.config.methods == ("fedol:rounds=2",) for r in extra)
    assert len(runs) == 8 + 2 and {r.config.methods for r in runs if r.config.seed == 0} == {
        ("fedavg", "local"),
        ("ensemble", "fedol:rounds=2"),
    }
    plain = parse_sweep(
        {
            "base": {"dataset": "digits", "methods": ["local", "fedavg"]},
            "seeds": [0],
            "claim_seeds": {"seeds": [1], "methods": ["fedavg"]},
        }
    )
    assert [(r.run_id, r.config.methods) for r in plain.runs][1] == ("seed=1", ("fedavg",))
    bad = [
        ({"methods": {"predictions": ["fedol"]}}, "expected some of .'ensemble', 'fedol:rounds"),
        ({"methods": {"server": ["fedol:rounds=2"]}}, "expected groups among"),
        ({"seeds": [0, 3]}, "does not run in full"),
        ({"grid": {"psi": 0.5, "graph": "ring"}}, "expected points of the sweep's grid"),
        ({"methods": []}, "expected a list of methods"),
        ({"every": 2}, "expected a mapping of seeds, methods and grid"),
        ({"seeds": [True]}, "expected a list of integers"),
        ({"methods": {"predictions": "fedol:rounds=2"}}, "expected a list of methods"),
        ({"grid": ["psi=0.1"]}, "expected a mapping or a list of mappings"),
    ]
    for change, message in bad:
        with pytest.raises(ConfigError, match=message):
            parse_sweep({**sweep, "claim_seeds": {**sweep["claim_seeds"], **change}})


def test_report_merges_groups_into_one_setting() -> None:
    from oneshotfl.runner.report import collect

    def doc(group: str, model: str, seed: int, keys: list[str]) -> dict[str, object]:
        config = {"partition": "dirichlet", "alpha": 0.1, "group": group, "model": model}
        config["seed"] = seed
        methods = [{"key": k, "accuracy": 0.5, "upload_bytes_mean": 1.0} for k in keys]
        return {"config": config, "methods": methods}

    docs = [
        doc("models", "cnn", 0, ["fedavg", "ensemble"]),
        doc("predictions", "cnn,mlp", 0, ["fedol", "ensemble"]),
        doc("models", "cnn", 1, ["fedavg", "ensemble"]),
    ]
    report = collect(docs)
    assert report.settings == ["dirichlet α=0.1"]  # model differs only between groups
    assert report.methods == ["fedavg", "ensemble [models]", "fedol", "ensemble [predictions]"]
    assert len(report.cells[("dirichlet α=0.1", "ensemble [models]")].accuracy) == 2
    # a separate run of the same setting and seed (a folder of runs, not a sweep) stays apart,
    # named by its folder
    again = {**doc("predictions", "cnn,mlp", 0, ["fedol"]), "_run": "fedol-again"}
    apart = collect([*docs, again])
    assert "dirichlet α=0.1 · run fedol-again" in apart.settings
    assert len(apart.cells[("dirichlet α=0.1 · run fedol-again", "fedol")].accuracy) == 1


def test_sweep_shards_keep_the_groups_of_a_point_together() -> None:
    from oneshotfl.runner.sweep import select_shard

    sweep = parse_sweep(
        {
            "grid": {"partition": "dirichlet", "alpha": [0.1, 0.5, 1.0]},
            "groups": {"a": {"model": "mlp"}, "b": {"model": "cnn"}},
            "seeds": [0, 1],
        }
    )
    shards = [select_shard(sweep.runs, f"{k}/2") for k in range(2)]
    assert sorted(r.run_id for s in shards for r in s) == sorted(r.run_id for r in sweep.runs)
    for shard in shards:
        points = {(r.config.seed, r.config.alpha) for r in shard}
        assert len(shard) == 2 * len(points)  # both groups of every point it holds
    assert select_shard(sweep.runs, None) == sweep.runs
    for bad in ("2/2", "x", "1/0"):
        with pytest.raises(ConfigError, match="--shard"):
            select_shard(sweep.runs, bad)


def test_report_finds_one_parameter_sweeps() -> None:
    from oneshotfl.runner.report import collect
    from oneshotfl.runner.report_plots import parameter_series

    def result(key: str, acc: float, **params: object) -> dict[str, object]:
        full = {"gamma": 0.75, "beta": 0.5, "dp_epsilon": None} | params
        return {"key": key, "method": "fedage", "params": full, "accuracy": acc,
                "upload_bytes_mean": 1.0}  # fmt: skip

    methods = [
        result("fedage", 0.8),
        result("fedage:gamma=0", 0.5, gamma=0.0),
        result("fedage:gamma=0.25", 0.6, gamma=0.25),
        result("fedage:dp_epsilon=1", 0.3, dp_epsilon=1.0),  # one point: no sweep
        result("fedage:gamma=0:beta=0", 0.1, gamma=0.0, beta=0.0),  # two changes: ignored
    ]
    doc = {"config": {"partition": "dirichlet", "alpha": 0.05, "seed": 0}, "methods": methods}
    series = parameter_series(collect([doc]))
    assert list(series) == [("fedage", "gamma")]
    assert sorted(series[("fedage", "gamma")]["dirichlet α=0.05"]) == [
        (0.0, 0.5, 0.0),
        (0.25, 0.6, 0.0),
        (0.75, 0.8, 0.0),
    ]


def test_report_orders_settings_by_value_and_plots_a_varying_key() -> None:
    from oneshotfl.runner.report import collect
    from oneshotfl.runner.report_plots import setting_series

    def doc(clients: int, seed: int, acc: float) -> dict[str, object]:
        config = {"partition": "dirichlet", "alpha": 0.1, "clients": clients, "seed": seed}
        return {
            "config": config,
            "methods": [{"key": "fedage", "accuracy": acc, "upload_bytes_mean": 1.0}],
        }

    report = collect([doc(10, 0, 0.3), doc(5, 0, 0.5), doc(50, 0, 0.2)])
    assert [s.split("=")[-1] for s in report.settings] == ["5", "10", "50"]
    assert sorted(setting_series(report)["clients"]["fedage"]) == [
        (5.0, 0.5, 0.0),
        (10.0, 0.3, 0.0),
        (50.0, 0.2, 0.0),
    ]
    assert setting_series(collect([doc(10, 0, 0.3), doc(10, 1, 0.4)])) == {}


def test_report_tables_the_clients_facts_by_setting() -> None:
    from oneshotfl.runner.report import collect, facts_table

    def doc(alpha: float, seed: int, facts: list[float | None]) -> dict[str, object]:
        config = {"partition": "dirichlet", "alpha": alpha, "seed": seed}
        method = {"key": "fedage", "accuracy": 0.5, "upload_bytes_mean": 1.0}
        other = {"key": "fedavg", "accuracy": 0.4, "upload_bytes_mean": 1.0}
        method["client_facts"] = {"pseudo_label_agreement": facts}
        return {"config": config, "methods": [method, other]}

    report = collect([doc(0.1, 0, [0.9, 1.0]), doc(0.1, 1, [0.8, None]), doc(1.0, 0, [0.5, 0.5])])
    table = facts_table(report)
    header = "| pseudo_label_agreement (%) | dirichlet α=0.1 | dirichlet α=1.0 |"
    assert table.splitlines()[0] == header
    # seed 0: mean over clients 0.95, seed 1: 0.8 (a missing value is left out): 87.5 ± 10.61
    # two seeds at α = 0.1: the 95% half-width t(0.975, 1) · 10.61 / √2; one seed at α = 1:
    # no interval, the mean alone
    assert "| fedage | 87.50 ± 95.30 | 50.00 |" in table
    assert "fedavg" not in table  # no facts, no row
    assert facts_table(collect([doc(0.1, 0, [])])) == ""


def test_the_final_models_inference_cost_by_hand() -> None:
    from torch import nn

    from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Personalised
    from oneshotfl.runner.evaluate import inference_cost

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))  # 15 parameters, 2·4·3 FLOPs
    x, cpu = torch.randn(5, 1, 2, 2), torch.device("cpu")
    assert inference_cost(GlobalModel(model), x, cpu) == {
        "parameters": 15.0,
        "flops_per_image": 24.0,
    }
    pair = Ensemble([model, copy.deepcopy(model)])
    members, combine = 2 * 24.0, 2 * 2 * 3.0  # the weighted mean: 2·M·C multiply-adds
    assert inference_cost(pair, x, cpu) == {
        "parameters": 30.0,
        "flops_per_image": members + combine,
    }
    assert inference_cost(Personalised({0: model}), x, cpu) == {}


def test_report_tables_server_seconds_and_inference_cost() -> None:
    from oneshotfl.runner.report import collect, cost_table

    def doc(seed: int, seconds: float) -> dict[str, object]:
        method = {
            "key": "intactofl",
            "accuracy": 0.5,
            "upload_bytes_mean": 10.0,
            "server_wall_s": seconds,
            "inference": {"parameters": 100.0, "flops_per_image": 2e6},
            "diagnostics": {"trainable_server_parameters": 40},
        }
        plain = {"key": "fedavg", "accuracy": 0.4, "upload_bytes_mean": 10.0}
        config = {"partition": "iid", "seed": seed}
        return {"config": config, "methods": [method, plain]}

    table = cost_table(collect([doc(0, 10.0), doc(1, 20.0)]))
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert rows["| intactofl"] == "| intactofl | 15.0 | 100 | 2e+06 | 40 |"
    assert rows["| fedavg"] == "| fedavg | 0.0 | – | – | – |"


def test_point_claims_go_to_one_holder_and_a_dead_holders_claim_is_taken_over(
    tmp_path: Path,
) -> None:
    import json
    import os
    import subprocess
    import sys

    from oneshotfl.runner.sweep import PointClaims

    first, second = PointClaims(tmp_path), PointClaims(tmp_path)
    assert first.take(0) and first.take(0)  # its own claim, again (the point's other groups)
    assert not second.take(0)  # a live process holds it
    assert second.take(1) and not first.take(1)
    owner = tmp_path / ".claims" / "point-1" / "owner.json"
    assert json.loads(owner.read_text())["pid"] == os.getpid()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    owner.write_text(json.dumps({**json.loads(owner.read_text()), "pid": int(gone.stdout)}))
    assert first.take(1)  # its holder is gone: taken over
    assert not second.take(1)
    other_host = tmp_path / ".claims" / "point-2"
    other_host.mkdir()
    stranger = {"host": "elsewhere", "pid": 1, "token": "x"}
    (other_host / "owner.json").write_text(json.dumps(stranger))
    assert not first.take(2)  # never taken from another host
    (tmp_path / ".claims" / "point-3").mkdir()  # an orphan: its process died before writing
    assert first.take(3) and not second.take(3)
    assert json.loads((tmp_path / ".claims" / "point-3" / "owner.json").read_text())["token"] == (
        first.token
    )
    assert sorted(p.name for p in (tmp_path / ".claims").iterdir()) == [
        f"point-{i}" for i in range(4)
    ]  # no staging or stale folder left behind


def test_nested_sections_set_the_flat_keys_and_the_flat_keys_still_read(tmp_path: Path) -> None:
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "data: {dataset: digits, public_size: 50, partition: iid, seed: 3}\n"
        "clients: {count: 4, model: mlp, epochs: 2, steps: 0, lr: 0.05, threads: 1}\n"
        "server: {model: mlp, steps: 0, lr: 0.01}\n"
        "security: {malicious: 1, attack: label_flip}\n"
        "methods: [fedavg]\n"
    )
    flat = make_config(
        {
            "dataset": "digits", "public_size": 50, "partition": "iid", "partition_seed": 3,
            "clients": 4, "model": "mlp", "local_epochs": 2, "local_steps": 0, "lr": 0.05,
            "client_threads": 1, "server_model": "mlp", "server_steps": 0, "server_lr": 0.01,
            "malicious": 1, "attack": "label_flip", "methods": ["fedavg"],
        }
    )  # fmt: skip
    assert load_config(nested) == flat
    assert make_config({"clients": 4}).clients == 4  # a plain value is the flat key
    assert "clients" in flat.to_dict() and "data" not in flat.to_dict()  # results stay flat
    with pytest.raises(ConfigError, match=r"dataset given twice, as data.dataset and dataset"):
        make_config({"data": {"dataset": "digits"}, "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"section server: unknown key 'modle'"):
        make_config({"server": {"modle": "mlp"}})
    assert make_config({"clients": {"local_epochs": 2}}).local_epochs == 2  # any flat key
