"""End to end on the real default dataset (Fashion-MNIST); slow, so kept to one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oneshotfl.cli.main import app
from oneshotfl.data.datasets import DatasetNotFoundError, load_dataset


@pytest.mark.slow
def test_fashion_mnist_run_learns(tmp_path: Path) -> None:
    try:
        load_dataset("fashion_mnist")
    except DatasetNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--dataset",
            "fashion_mnist",
            "--max-train",
            "3000",
            "--clients",
            "4",
            "--partition",
            "dirichlet",
            "--alpha",
            "0.5",
            "--model",
            "cnn",
            "--local-epochs",
            "3",
            "--local-steps",
            "0",
            "--method",
            "local,fedavg,ensemble,centralized",
            "--device",
            "cpu",
            "--out",
            str(out),
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    acc = {m["key"]: m["accuracy"] for m in doc["methods"]}
    assert doc["data"]["test_size"] == 10_000 and doc["data"]["client_examples"] == 3000
    # Far above chance (10%) for the pooled model; the ensemble beats chance too.
    assert acc["centralized"] > 0.6
    assert acc["ensemble"] > 0.3
