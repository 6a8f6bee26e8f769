"""The CUDA path, in one command for whoever has a GPU (skipped on machines without one, such
as CI): ``make test-cuda`` (``make test`` hides GPUs, so that it runs the same everywhere).

It runs the demo's config (``configs/demo.yaml``: every seed system, SimCLR's encoder
included) and every registered method at tiny budgets on the GPU, checks that each one uses
every client and that a CUDA run matches itself, and that what the methods make without a
GPU check — ``oneshotfl.devices.DeviceAudit`` in the contract suite — holds on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fingerprints import contract_config, contract_method
from helpers import prepare, run_config, run_over, tiny_demo
from oneshotfl.methods import METHODS
from oneshotfl.runner.compare import result_differences
from oneshotfl.runner.transport import LocalTransport

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_run_matches_itself_and_learns(tiny_config: Any) -> None:
    cfg = tiny_config(device="cuda", model="cnn", local_epochs=3)
    first = run_config(cfg)
    assert first["environment"]["device"].startswith("cuda")
    assert first["environment"]["gpu"]  # the result says on what it ran
    again = run_config(tiny_config(device="cuda", model="cnn", local_epochs=3, cache_dir=None))
    acc = {m["key"]: m["accuracy"] for m in first["methods"]}
    acc2 = {m["key"]: m["accuracy"] for m in again["methods"]}
    assert acc == pytest.approx(acc2, abs=0.01)
    assert acc["centralized"] > 0.5


def test_fol_prunes_and_caches_on_cuda(tiny_config: Any) -> None:
    cfg = tiny_config(
        device="cuda", model="cnn", clients=4, graph="ring", val_fraction=0.2,
        methods=["fol:rounds=2:kd_epochs=1", "fol-a:rounds=2:kd_epochs=1"],
    )  # fmt: skip
    doc = run_config(cfg)
    for method in doc["methods"]:
        assert method["clients_used"] == [0, 1, 2, 3]
        aligned = method["diagnostics"]["0"]["rounds"][0]["aligned"]
        assert all(a["params_after"] < a["params_before"] for a in aligned.values())


def test_the_demo_config_runs_on_cuda(tmp_path: Path) -> None:
    """``make demo``'s config with its budgets cut (Fashion-MNIST 3 000, one epoch)."""
    cfg = tiny_demo(tmp_path / "cache", device="cuda", max_train=3000, public_size=600)
    doc = run_config(cfg)
    assert doc["environment"]["device"].startswith("cuda")
    for method in doc["methods"]:
        assert method["clients_used"] == list(range(cfg.clients)), method["key"]


def test_clients_in_flight_on_one_gpu_give_the_same_result(tiny_config: Any) -> None:
    """``workers=3`` on a GPU: three processes share it, each client's update as in one."""
    settings = {"device": "cuda", "model": "cnn", "clients": 4, "cache_dir": None}
    one = run_config(tiny_config(**settings, workers=1))
    three = run_config(tiny_config(**settings, workers=3))
    assert three["environment"]["workers"] == 3
    assert result_differences(one, three) == []


@pytest.mark.parametrize("name", METHODS.names())
def test_every_registered_method_runs_on_cuda(name: str) -> None:
    """Each method on the contract suite's digits federation, on the GPU."""
    exp = prepare(contract_config(name, device="cuda"))
    result = run_over(name, contract_method(name), exp, LocalTransport(exp)).to_dict()
    assert result["clients_used"] == list(range(exp.cfg.clients)), result
    assert 0.0 <= result["accuracy"] <= 1.0


def test_clients_trained_together_on_cuda_equal_one_at_a_time(tiny_config: Any) -> None:
    """``client_batch`` on the GPU (issue 41): stacked training and evaluation give the
    accuracies of one client at a time, up to floating-point order."""
    settings = {"device": "cuda", "model": "cnn", "clients": 6, "cache_dir": None,
                "methods": ["local", "fedavg", "ensemble"]}  # fmt: skip
    one = run_config(tiny_config(**settings, local_epochs=3))
    many = run_config(tiny_config(**settings, local_epochs=3, client_batch=4))
    for a, b in zip(one["methods"], many["methods"], strict=True):
        assert a["clients_used"] == b["clients_used"] == list(range(6))
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.02, a["key"]
