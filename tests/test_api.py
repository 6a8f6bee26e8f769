"""The Python API (``oneshotfl.run``, ``oneshotfl.sweep``, ``oneshotfl.Result``) on tiny
digits runs, the committed result files read back, and the example script."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

import oneshotfl
from helpers import TINY, load_script
from oneshotfl.api import Result, SweepResult, resolve_config
from oneshotfl.cli.main import app
from oneshotfl.environment import kernel_differences, kernel_signature
from oneshotfl.runner.config import ConfigError, ExperimentConfig, make_config
from oneshotfl.runner.results import METHOD_COLUMNS, MethodResult

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "reproduce_row.py"


def test_import_stays_cheap_and_exports_the_api() -> None:
    code = "import sys, oneshotfl; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert oneshotfl.run is oneshotfl.api.run and oneshotfl.sweep is oneshotfl.api.sweep
    assert oneshotfl.Result is Result and oneshotfl.ConfigError is ConfigError
    assert {"run", "sweep", "Result"} <= set(dir(oneshotfl))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = oneshotfl.nothing


def test_run_returns_the_typed_result_it_writes(tiny_config: Any, tmp_path: Path) -> None:
    cfg = tiny_config(methods=["local", "fedavg", "ensemble:weighting=size"])
    out = tmp_path / "run"
    result = oneshotfl.run(cfg, out)
    assert isinstance(result, Result) and result.config == cfg
    assert result.path == out / "result.json"
    doc = json.loads(result.path.read_text())
    assert result.to_dict() == doc
    built = dataclasses.replace(result)  # no source document: built from the typed fields
    assert built == result and built.to_dict() == doc
    assert Result.load(out) == result and Result.load(out / "result.json").to_dict() == doc
    for name in ("methods.csv", "clients.csv", "partition.png"):
        assert (out / name).stat().st_size > 0
    assert result.keys == ("local", "fedavg", "ensemble:weighting=size")
    fedavg = result.method("fedavg")
    assert isinstance(fedavg, MethodResult) and fedavg.accuracy == result.accuracy["fedavg"]
    assert result.method("ensemble") is result.methods[2]  # the only method of that name
    with pytest.raises(KeyError, match="expected one of the methods"):
        result.method("fedprox")
    knobs = dataclasses.replace(result.methods[2], key="ensemble:a=1:weighting=size")
    spelled = dataclasses.replace(result, methods=(*result.methods[:2], knobs))
    assert spelled.method("ensemble:weighting=size:a=1") is knobs  # the knobs in another order
    assert [list(row) for row in result.table()] == [list(METHOD_COLUMNS)] * 3
    assert result.table()[1]["upload_bytes_mean"] == fedavg.upload_bytes_mean
    assert len(result.clients) == cfg.clients and result.environment["device"] == "cpu"
    with pytest.raises(ConfigError, match="exists; choose another out"):
        oneshotfl.run(cfg, out)


def test_run_without_out_writes_nothing(tiny_config: Any, tmp_path: Path) -> None:
    cfg = tiny_config()
    result = oneshotfl.run(dict(cfg.to_dict()), methods="fedavg", clients=2)
    assert result.path is None and result.keys == ("fedavg",)
    assert result.config == dataclasses.replace(cfg, methods=("fedavg",), clients=2)
    assert not list(tmp_path.glob("**/result.json"))
    assert not result.differences(Result.from_dict(result.to_dict()))


def test_config_forms_agree(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**TINY, "methods": ["fedavg"]}))
    want = make_config({**TINY, "methods": ["fedavg"], "seed": 3})
    assert resolve_config(path, seed=3) == want
    assert resolve_config(str(path), seed=3) == want
    assert resolve_config({**TINY, "methods": "fedavg", "seed": 3}) == want
    assert resolve_config(make_config({**TINY, "methods": ["fedavg"]}), seed=3) == want
    assert resolve_config(want) is want
    assert resolve_config(None, **TINY, methods=["fedavg"], seed=3) == want
    assert resolve_config({"local-epochs": 2}, local_epochs=4).local_epochs == 4


def test_user_errors_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        oneshotfl.run(TINY, bogus=1)
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        oneshotfl.run(TINY, methods=["nope"], cache_dir=None)
    with pytest.raises(ConfigError, match="clients: expected >= 1"):
        oneshotfl.run(TINY, clients=0)
    with pytest.raises(ConfigError, match="does not exist"):
        oneshotfl.run(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected an ExperimentConfig"):
        oneshotfl.run(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--shard"):
        oneshotfl.sweep({"base": TINY}, tmp_path / "s", shard="2/2")


def test_claiming_processes_run_every_point_once(tmp_path: Path) -> None:
    """Two sweep processes with ``--claim`` on one results folder (threads here: each holds its
    own claims) run every point exactly once between them, and each writes its record."""
    import threading

    spec = {
        "name": "tiny",
        "base": {**TINY, "methods": ["fedavg"], "cache_dir": None},
        "grid": [{"alpha": [0.5, 1.0, 2.0, 5.0]}],
    }
    done: dict[int, tuple[str, ...]] = {}

    def worker(k: int) -> None:
        done[k] = oneshotfl.sweep(spec, tmp_path / "s", (k, 2), claim=True).ran

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ran = [run for k in (0, 1) for run in done[k]]
    assert sorted(ran) == sorted(f"alpha={a}_seed=0" for a in (0.5, 1.0, 2.0, 5.0))
    for k in (0, 1):
        record = json.loads((tmp_path / "s" / f"sweep-shard-{k}of2.json").read_text())
        assert record["ran_now"] == len(done[k]) and "claim=True" in record["argv"][0]
    with pytest.raises(ConfigError, match="--claim: expected --shard"):
        oneshotfl.sweep(spec, tmp_path / "t", claim=True)


def test_a_point_finished_by_a_process_that_exited_is_read_back_not_run_again(
    tmp_path: Path,
) -> None:
    """Under ``--claim``, a point whose holder finished it and exited (its claim is then taken
    over) is read back from the result that holder wrote, not trained a second time."""
    import shutil
    import socket

    spec = {
        "name": "tiny",
        "base": {**TINY, "methods": ["fedavg"], "cache_dir": None},
        "grid": [{"alpha": [0.5, 1.0]}],
    }
    elsewhere = oneshotfl.sweep(spec, tmp_path / "other")  # what the other process wrote
    second = "alpha=1.0_seed=0"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip

    def other_process_finished_the_second(run_id: str, doc: dict[str, Any]) -> None:
        claim = tmp_path / "s" / ".claims" / "point-1"
        claim.mkdir(parents=True)
        owner = {"host": socket.gethostname(), "pid": int(gone.stdout), "token": "gone"}
        (claim / "owner.json").write_text(json.dumps(owner))
        # written now, as by the other process (copy, not copy2: a fresh modification time)
        shutil.copytree(
            tmp_path / "other" / second, tmp_path / "s" / second, copy_function=shutil.copy
        )

    mine = oneshotfl.sweep(
        spec, tmp_path / "s", (0, 2), claim=True, on_result=other_process_finished_the_second
    )
    assert mine.ran == ("alpha=0.5_seed=0",)
    assert mine.results[second].methods[0].accuracy == elsewhere.results[second].methods[0].accuracy


def test_sweep_resumes_and_matches_the_command(tmp_path: Path) -> None:
    spec = {
        "name": "tiny",
        "base": {**TINY, "methods": ["fedavg"], "cache_dir": str(tmp_path / "cache")},
        "grid": [{"partition": "iid"}],
        "seeds": [0, 1],
    }
    file = tmp_path / "tiny.yaml"
    file.write_text(yaml.safe_dump(spec))
    out = tmp_path / "api"
    done = oneshotfl.sweep(file, out)
    assert isinstance(done, SweepResult) and done.name == "tiny" and len(done) == 2
    assert done.ran == ("partition=iid_seed=0", "partition=iid_seed=1")
    assert done["partition=iid_seed=1"].config.seed == 1
    assert [row["run"] for row in done.table()] == list(done.ran)
    again = oneshotfl.sweep(spec, out)  # finished runs are read back, not run again
    assert again.ran == () and dict(again.results) == dict(done.results)
    assert oneshotfl.sweep(file, out, (1, 2), seeds=[1], force=True).ran == (
        "partition=iid_seed=1",
    )
    records = {p.name: json.loads(p.read_text()) for p in out.glob("sweep*.json")}
    # named as the command names them
    assert set(records) == {"sweep.json", "sweep-seeds-1_shard-1of2.json"}
    # the plain call that read both runs back kept the record of the one that ran them
    assert records["sweep.json"]["ran_now"] == 2
    assert records["sweep-seeds-1_shard-1of2.json"]["ran_now"] == 1
    cli = CliRunner().invoke(app, ["sweep", str(file), "--out", str(tmp_path / "cli")])
    assert cli.exit_code == 0, cli.output
    assert json.loads((tmp_path / "cli" / "sweep.json").read_text())["ran_now"] == 2
    for run_id, result in done.results.items():
        assert not result.differences(Result.load(tmp_path / "cli" / run_id))
    grown = {**spec, "base": {**spec["base"], "methods": ["fedavg", "ensemble"]}}
    rerun = oneshotfl.sweep(grown, out)  # a point run with another config is not finished
    assert rerun.ran == done.ran
    assert oneshotfl.sweep(grown, out).ran == ()


def test_method_result_round_trips_and_reads_older_entries() -> None:
    entry = {
        "key": "fedavg",
        "method": "fedavg",
        "params": {},
        "outcome": "GlobalModel",
        "accuracy": 0.5,
        "personal_accuracy": 0.4,
        "upload_bytes_per_client": [10, 20],
        "communicates": True,
        "client_wall_s": [0.1, 0.3],
        "server_wall_s": 0.2,
        "clients_used": [0, 1],
        "client_train_s_mean": 0.2,  # an older version's field
    }
    old = MethodResult.from_dict(entry)
    assert old.rounds == 1 and old.download_bytes_per_client == 0
    assert MethodResult.from_dict(old.to_dict()) == old
    assert old.to_dict()["upload_bytes_mean"] == 15.0
    with pytest.raises(ValueError, match=r"expected the fields \['accuracy'\]"):
        MethodResult.from_dict({k: v for k, v in entry.items() if k != "accuracy"})


def test_committed_result_files_read_back_exactly() -> None:
    files = sorted((ROOT / "benchmarks" / "results").rglob("result.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        result = Result.load(path)
        assert isinstance(result.config, ExperimentConfig)
        assert result.to_dict() == doc, path
        assert result.keys == tuple(m["key"] for m in doc["methods"])
    with pytest.raises(ValueError, match="expected a result document"):
        Result.from_dict({"methods": []})


def _example(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``examples/reproduce_row.py ARGS`` single-threaded, with ``env`` added."""
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=300,
    )


class _Runs:
    """``oneshotfl.run`` for the example in this process: the first real runs of its config,
    made once and handed out again in the order an invocation asks for them (its first run
    the first, its second the second), so that each check still compares two real runs."""

    def __init__(self) -> None:
        self.run = oneshotfl.run
        self.made: list[tuple[object, Result]] = []
        self.calls = 0  # this invocation's

    def __call__(self, config: Any, **kwargs: Any) -> Result:
        key, n = (config, sorted(kwargs.items())), self.calls
        self.calls += 1
        if n < len(self.made) and self.made[n][0] == key:
            return self.made[n][1]
        result = self.run(config, **kwargs)  # another config or argument: a run of its own
        if n == len(self.made):
            self.made.append((key, result))
        return result


@pytest.fixture(scope="module")
def example_runs() -> _Runs:
    """The runs of the tests of one worker (``xdist_group("example")``: all of them)."""
    return _Runs()


Example = Callable[..., tuple[int, str, str]]


@pytest.fixture
def example(
    example_runs: _Runs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Example:
    """``examples/reproduce_row.py ARGS`` in this process (its ``main``): its exit status,
    stdout and stderr; torch's thread count, which it sets, is restored afterwards. (Its
    ``__main__`` path, in a process of its own, is the test on other kernels' one.)"""
    script = load_script(EXAMPLE)
    monkeypatch.setattr(oneshotfl, "run", example_runs)
    threads = torch.get_num_threads()

    def run(*args: str) -> tuple[int, str, str]:
        example_runs.calls = 0
        capsys.readouterr()
        try:
            code = script.main(list(args))
        finally:
            torch.set_num_threads(threads)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.mark.xdist_group("example")
def test_example_reproduces_its_committed_result(example: Example) -> None:
    """Exactly where the committed result's kernels ran it (same CPU, instruction set, torch,
    threads), within its tolerance elsewhere: the test passes on any machine."""
    committed = Result.load(ROOT / "examples" / "digits-row" / "result.json")
    assert resolve_config(ROOT / "examples" / "digits-row.yaml") == committed.config
    assert {"cpu", "cpu_id", "isa", "torch", "threads"} <= set(committed.environment)
    code, out, err = example()
    assert code == 0, out + err
    here = {**kernel_signature("cpu"), "threads": 1}
    if kernel_differences(committed.environment, here):
        assert "identical to itself, within tolerance" in out
    else:
        assert "same kernels as recorded" in out and "| fedavg | 59.89 | 59.89 |" in out


def _elsewhere(tmp_path: Path, **accuracy: float) -> Path:
    """The committed digits result rewritten as if recorded on another CPU (its spread
    beside it), with ``accuracy`` overriding methods' committed test accuracies."""
    folder = ROOT / "examples" / "digits-row"
    doc = json.loads((folder / "result.json").read_text())
    doc["environment"].update(cpu="Other CPU", cpu_id="GenuineIntel family 6 model 85", isa="AVX2")
    for m in doc["methods"]:
        m["accuracy"] = accuracy.get(m["key"], m["accuracy"])
    (tmp_path / "result.json").write_text(json.dumps(doc))
    (tmp_path / "spread.json").write_text((folder / "spread.json").read_text())
    return tmp_path / "result.json"


@pytest.mark.xdist_group("example")
def test_a_result_recorded_elsewhere_is_checked_within_its_spread(
    tmp_path: Path, example: Example
) -> None:
    code, out, err = example(str(_elsewhere(tmp_path)))
    assert code == 0, out + err
    assert "recorded on other kernels (cpu: 'Other CPU' recorded" in out
    assert "identical to itself, within tolerance" in out


@pytest.mark.xdist_group("example")
def test_a_result_recorded_elsewhere_still_fails_beyond_its_tolerance(
    tmp_path: Path, example: Example, example_runs: _Runs
) -> None:
    code, _, err = example(str(_elsewhere(tmp_path, centralized=0.5)))
    assert code == 1
    assert "centralized.accuracy: 50.00 committed" in err and "tolerance ±" in err
    spread = json.loads((ROOT / "examples/digits-row/spread.json").read_text())["std"]
    assert set(spread["accuracy"]) == set(Result.load(tmp_path / "result.json").keys)
    no_spread = tmp_path / "alone"
    no_spread.mkdir()
    (no_spread / "result.json").write_text((tmp_path / "result.json").read_text())
    with pytest.raises(SystemExit, match="expected --tolerance POINTS"):
        example(str(no_spread / "result.json"))
    assert example_runs.calls == 0  # refused before anything trained


@pytest.mark.skipif(
    kernel_signature()["isa"] == "DEFAULT", reason="torch already runs its plainest kernels"
)
def test_the_example_holds_on_other_kernels_of_this_machine() -> None:
    """Other CPUs, emulated: torch (ATen), oneDNN and MKL held to their plainest instruction
    sets run other float kernels — as the AVX2 machine of issue 34 did, whose run of the
    committed example differed in 20 places."""
    plain = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    done = _example(**plain, MKL_ENABLE_INSTRUCTIONS="SSE4_2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'DEFAULT' here" in done.stdout and "within tolerance" in done.stdout


def test_a_sweep_checks_every_point_before_the_first_one_trains(tmp_path: Path) -> None:
    spec = {
        "name": "bad",
        "base": {**TINY, "methods": ["fedavg"], "cache_dir": str(tmp_path / "cache")},
        "grid": [{"partition": "dirichlet", "alpha": [1.0, -1.0]}, {"methods": [["fedol"]]}],
    }
    out = tmp_path / "bad"
    with pytest.raises(
        ConfigError, match=r"sweep point partition=dirichlet_alpha=-1.0_seed=0: partition"
    ):
        oneshotfl.sweep({**spec, "grid": spec["grid"][:1]}, out)
    with pytest.raises(
        ConfigError, match="methods=--fedol--_seed=0: cannot run: fedol needs a public"
    ):
        oneshotfl.sweep({**spec, "grid": spec["grid"][1:]}, out)
    assert not list(out.rglob("result.json"))  # nothing trained
    cli = CliRunner().invoke(app, ["sweep", str(_yaml(tmp_path, spec)), "--out", str(out)])
    assert cli.exit_code == 2 and "Traceback" not in cli.output and "sweep point" in cli.output
    done = oneshotfl.sweep({**spec, "grid": [{"partition": "iid"}]}, out, overrides={"clients": 2})
    assert [r.config.clients for r in done.results.values()] == [2]
    for key in ("partition", "seed"):  # the grid and the seeds give those: never overridden
        with pytest.raises(
            ConfigError, match=f"expected keys the grid does not set, got \\['{key}'\\]"
        ):
            oneshotfl.sweep({**spec, "grid": [{"partition": "iid"}]}, out, overrides={key: 0})


def _yaml(tmp_path: Path, spec: dict[str, object]) -> Path:
    file = tmp_path / "spec.yaml"
    file.write_text(yaml.safe_dump(spec))
    return file
