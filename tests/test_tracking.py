"""Experiment tracking against the real libraries (issue 16, item 2): a run and a sweep logged
with ``--track tensorboard --track mlflow`` are read back from TensorBoard's event files and
from the MLflow store — parameters, result metrics, per-epoch server losses, client
statistics and artefacts — and a missing library is a one-line error."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import oneshotfl
from helpers import TINY
from oneshotfl.cli.main import app
from oneshotfl.runner.config import ConfigError
from oneshotfl.tracking import TrackedProgress, open_logs, result_points, tag_name

# skipped without the track extra; the libraries are imported by the tests that use them (a
# pytest worker that only collects this file does not pay for them)
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("tensorboard", "mlflow")),
    reason="needs the track extra (tensorboard, mlflow)",
)

SETTINGS = {**TINY, "public_size": 100, "server_epochs": 2}


def _args(settings: dict[str, Any]) -> list[str]:
    return [f"{k}={v}" for k, v in settings.items()]


def _tensorboard(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0}
    )
    acc.Reload()
    return acc


def _mlflow(root: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{root.resolve() / 'mlflow.db'}")


def test_a_tracked_run_is_read_back_from_tensorboard_and_mlflow(tmp_path: Path) -> None:
    track = tmp_path / "track"
    out = tmp_path / "out"
    args = ["run", *_args(SETTINGS), "methods=fedavg,feddf", "--no-cache", "--out", str(out)]
    args += ["--track", "tensorboard", "--track", "mlflow", "--track-dir", str(track)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    accuracy = {m["key"]: m["accuracy"] for m in doc["methods"]}

    tb = _tensorboard(track / "oneshotfl" / "out")
    tags = tb.Tags()
    assert [e.value for e in tb.Scalars("fedavg/accuracy")] == pytest.approx([accuracy["fedavg"]])
    server = [t for t in tags["scalars"] if t.startswith("loss/feddf_server")]
    assert len(server) == 1 and [e.step for e in tb.Scalars(server[0])] == [0, 1]
    clients = tb.Scalars("clients/train_size")
    assert [e.value for e in clients] == [row["train_size"] for row in doc["clients"]]
    assert "partition" in tags["images"]
    assert {"config/text_summary", "methods/text_summary"} <= set(tags["tensors"])

    client = _mlflow(track)
    experiment = client.get_experiment_by_name("oneshotfl")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "out" and run.info.status == "FINISHED"
    assert run.data.params["dataset"] == "digits" and run.data.params["server_epochs"] == "2"
    assert run.data.metrics["feddf/accuracy"] == pytest.approx(accuracy["feddf"])
    history = client.get_metric_history(run.info.run_id, tag_name(server[0]))
    assert [m.step for m in history] == [0, 1]
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "methods.csv", "clients.csv", "partition.png"} <= files


def test_a_tracked_sweep_logs_one_run_per_point_grouped_by_the_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "tiny.yaml"
    base = {**TINY, "methods": ["fedavg"], "cache_dir": str(tmp_path / "cache")}
    sweep.write_text(
        yaml.safe_dump({"name": "tiny", "base": base, "grid": [{"alpha": [0.5, 1.0]}]})
    )
    track = tmp_path / "track"
    args = ["sweep", str(sweep), "--out", str(tmp_path / "runs"), "--track", "mlflow"]
    result = CliRunner().invoke(app, [*args, "--track", "tensorboard", "--track-dir", str(track)])
    assert result.exit_code == 0, result.output
    points = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(points) == 2
    client = _mlflow(track)
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert sorted(r.info.run_name for r in runs) == points
    assert {r.data.tags["oneshotfl.group"] for r in runs} == {"tiny"}
    assert sorted(p.name for p in (track / "tiny").iterdir()) == points


def test_the_python_api_tracks_a_run_and_a_sweep_as_the_command_does(tmp_path: Path) -> None:
    track = tmp_path / "track"
    settings = {**TINY, "methods": ["fedavg"], "cache_dir": str(tmp_path / "cache")}
    result = oneshotfl.run(settings, tmp_path / "out", track=["tensorboard"], track_dir=track)
    tb = _tensorboard(track / "oneshotfl" / "out")
    assert [e.value for e in tb.Scalars("fedavg/accuracy")] == pytest.approx(
        [result.accuracy["fedavg"]]
    )
    oneshotfl.run(settings, track=["mlflow"], track_dir=track)  # no out: a run named "api"
    spec = {"name": "tiny", "base": settings, "grid": [{"alpha": [0.5, 1.0]}]}
    done = oneshotfl.sweep(spec, tmp_path / "runs", track=["mlflow"], track_dir=track)
    client = _mlflow(track)
    (alone,) = client.search_runs([client.get_experiment_by_name("oneshotfl").experiment_id])
    assert alone.info.run_name == "api" and "fedavg/accuracy" in alone.data.metrics
    assert alone.data.params["dataset"] == "digits"
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(done.ran)
    with pytest.raises(ConfigError, match="--track"):
        oneshotfl.run(settings, track=["wandb"])


def _open_and_close(root: str, run: str) -> None:
    for log in open_logs(["mlflow"], "shards", run, Path(root)):
        log.scalar("opened", 0, 1.0)  # a run opens on its first record
        log.close()


def test_two_sweep_shards_open_one_fresh_mlflow_store_at_once(tmp_path: Path) -> None:
    """Two processes (as two shards are) race to create one store. They are forked where the
    worker pool forks its workers (no accelerator: safe), so they start at once and do not
    import this module, torch and MLflow again; else they come from a forkserver."""
    from oneshotfl.runner.pool import start_method

    importlib.import_module("mlflow.tracking")  # before the fork: the children have it
    forked = start_method(1) == "fork"
    context = (
        multiprocessing.get_context("fork") if forked else multiprocessing.get_context("forkserver")
    )
    procs = [
        context.Process(target=_open_and_close, args=(str(tmp_path), f"run-{i}")) for i in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    client = _mlflow(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("shards").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["run-0", "run-1"]


def test_losses_continue_one_curve_per_tag_and_results_cover_every_method() -> None:
    seen: list[tuple[str, int, float]] = []

    class Log:
        def scalar(self, tag: str, step: int, value: float) -> None:
            seen.append((tag, step, value))

    progress = TrackedProgress(None, [Log()])  # type: ignore[list-item]
    for epoch in range(2):
        progress.scalar("loss/a", epoch, 1.0)
    progress.scalar("loss/a", 0, 0.5)  # the same model trained again: its curve goes on
    assert [s for _, s, _ in seen] == [0, 1, 2]
    doc = {
        "methods": [
            {"key": "m", "accuracy": 0.5, "client_personal_accuracy": [0.1, None, 0.3]},
            {"key": "r", "accuracy": 0.7, "rounds_history": [{"round": 1, "accuracy": 0.6}]},
        ],
        "clients": [{"client": 0, "train_size": 5, "val_size": 1}],
    }
    points = list(result_points(doc))
    assert ("m/client_personal_accuracy", 2, 0.3) in points
    assert ("m/client_personal_accuracy", 1, 0.0) not in points
    assert ("r/accuracy_by_round", 1, 0.6) in points
    assert ("clients/val_size", 0, 1.0) in points


def test_unknown_or_missing_backends_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="expected one of mlflow, tensorboard, got 'wandb'"):
        open_logs(["wandb"], "g", "r", tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"oneshotfl\[track\]"):
        open_logs(["mlflow"], "g", "r", tmp_path)
    result = CliRunner().invoke(
        app, ["run", *_args(TINY), "--track", "mlflow", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code != 0 and "oneshotfl[track]" in result.output
    assert "Traceback" not in result.output


def test_a_run_refused_before_training_leaves_nothing_in_the_stores(tmp_path: Path) -> None:
    track = tmp_path / "track"
    args = ["run", *_args(SETTINGS), "methods=fedavg", "model=no_such_model", "--no-cache"]
    args += ["--out", str(tmp_path / "out"), "--track", "tensorboard", "--track", "mlflow"]
    result = CliRunner().invoke(app, [*args, "--track-dir", str(track)])
    assert result.exit_code == 2 and "unknown model 'no_such_model'" in result.output
    assert not list(track.rglob("events.out.tfevents.*"))  # no empty event file
    if (track / "mlflow.db").exists():  # no FAILED run either
        client = _mlflow(track)
        assert not [
            r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
        ]


def test_mlflow_tracking_uri_names_and_what_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{(tmp_path / 'server.db').resolve()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # TensorBoard's default directory is relative
    oneshotfl.run(
        {**SETTINGS, "methods": ["fedavg:weighting=size"], "cache_dir": None},
        tmp_path / "out", track=["mlflow", "tensorboard"], track_dir=None,
        track_experiment="my-study", track_run="first-try", save_models=True,
    )  # fmt: skip
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("my-study")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "first-try"
    params = run.data.params
    assert params["method.fedavg:weighting_size.weighting"] == "size"
    assert params["environment.data_hash"] and params["environment.cpu"]
    assert "environment.git_commit" in params
    assert all(" " not in key for key in [*run.data.metrics, *params])
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "fedavg_weighting=size.safetensors"} <= logged  # the saved model
    tb = _tensorboard(Path("runs/tensorboard") / "my-study" / "first-try")
    assert tb.PluginTagToContent("hparams")  # the HParams view
    assert all(" " not in tag for tag in tb.Tags()["scalars"])


def test_an_unusable_mlflow_tracking_uri_is_one_line_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    args = ["run", *_args(SETTINGS), "methods=fedavg", "--no-cache", "--track", "mlflow"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "MLFLOW_TRACKING_URI=nosuchscheme://nowhere" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "result.json").exists()
