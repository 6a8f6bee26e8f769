"""The CUDA path (skipped on machines without a GPU, such as CI)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from oneshotfl.runner.experiment import run_experiment

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_run_matches_itself_and_learns(tiny_config: Any) -> None:
    cfg = tiny_config(device="cuda", model="cnn", local_epochs=3)
    first = run_experiment(cfg)
    assert first["environment"]["device"].startswith("cuda")
    again = run_experiment(tiny_config(device="cuda", model="cnn", local_epochs=3, cache_dir=None))
    acc = {m["key"]: m["accuracy"] for m in first["methods"]}
    acc2 = {m["key"]: m["accuracy"] for m in again["methods"]}
    assert acc == pytest.approx(acc2, abs=0.01)
    assert acc["centralized"] > 0.5


def test_fol_prunes_and_caches_on_cuda(tiny_config: Any) -> None:
    cfg = tiny_config(
        device="cuda", model="cnn", clients=4, graph="ring", val_fraction=0.2,
        methods=["fol:rounds=2:kd_epochs=1", "fol-a:rounds=2:kd_epochs=1"],
    )  # fmt: skip
    doc = run_experiment(cfg)
    for method in doc["methods"]:
        assert method["clients_used"] == [0, 1, 2, 3]
        aligned = method["diagnostics"]["0"]["rounds"][0]["aligned"]
        assert all(a["params_after"] < a["params_before"] for a in aligned.values())
