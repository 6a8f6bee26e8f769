"""Resume inside a run (issue 15): a run killed with SIGKILL after some clients finished
restarts, trains only the clients whose models are not in the artefact cache, and ends with
a result identical to an uninterrupted run's. Only the killed run is a process of its own (a
real SIGKILL); the resumed and the uninterrupted one run the same command in this one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oneshotfl.cli.main import app
from oneshotfl.runner.compare import result_differences

CLIENTS = 6


def command(out: Path, cache: Path) -> list[str]:
    return [
        sys.executable, "-m", "oneshotfl", "run", "--method", "fedavg,ensemble",
        "dataset=digits", f"clients={CLIENTS}", "model=mlp", "local_epochs=30", "local_steps=0",
        "seed=0", "device=cpu", "partition=iid", f"cache_dir={cache}", "--out", str(out),
    ]  # fmt: skip


def in_process(out: Path, cache: Path) -> None:
    """The command of :func:`command`, run in this process."""
    done = CliRunner().invoke(app, command(out, cache)[3:])
    assert done.exit_code == 0, done.output


def cached_models(cache: Path) -> int:
    return len(list((cache / "local_model").rglob("*.safetensors")))


def test_a_killed_run_trains_only_the_missing_clients_and_ends_identical(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    run = subprocess.Popen(
        command(tmp_path / "killed", cache),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while run.poll() is None and cached_models(cache) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait()
    finished = cached_models(cache)
    if run.returncode == 0 or finished == CLIENTS:
        pytest.fail(f"the run finished before it was killed ({finished} clients cached)")
    assert finished >= 1 and not (tmp_path / "killed" / "result.json").exists()

    in_process(tmp_path / "resumed", cache)
    resumed = json.loads((tmp_path / "resumed" / "result.json").read_text())
    assert resumed["cache"]["misses"] == CLIENTS - finished  # only the missing clients trained
    assert cached_models(cache) == CLIENTS

    fresh = tmp_path / "fresh-cache"
    in_process(tmp_path / "fresh", fresh)
    uninterrupted = json.loads((tmp_path / "fresh" / "result.json").read_text())
    assert result_differences(uninterrupted, resumed) == []
