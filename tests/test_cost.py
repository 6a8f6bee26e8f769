"""FLOP counting: checked by hand on a linear layer, and the FedAGE-vs-full comparison."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders import build_encoder
from oneshotfl.encoders.cost import (
    client_gflops_curve,
    forward_flops,
    train_step_flops,
    trainable_parameters,
)
from oneshotfl.models import create_model


def test_linear_layer_flops_by_hand() -> None:
    layer = nn.Linear(3, 2, bias=False)
    x = torch.randn(4, 3)
    assert forward_flops(layer, x) == 2 * 3 * 2  # one multiply-add = 2 FLOPs per weight
    # backward: grad w.r.t. the weight (2·3·2) — the input needs no gradient
    assert train_step_flops(layer, x, num_classes=2) == 2 * (2 * 3 * 2)
    assert layer.weight.grad is None  # gradients are cleared afterwards


def test_frozen_encoder_plus_head_costs_less_than_full_training() -> None:
    task = TaskInfo("fashion_mnist", 10, 1, 28)
    encoder = build_encoder("random:dim=64", task, 0)
    x = torch.randn(8, 1, 28, 28)
    enc = forward_flops(lambda b: encoder.module(b), x)
    head = create_model("head_mlp", 64, 10, 1)
    head_step = train_step_flops(head, torch.randn(8, 64), 10)
    full_step = train_step_flops(create_model("cnn", 1, 10, 28), x, 10)
    assert trainable_parameters(encoder.module) == 0
    assert trainable_parameters(head) < trainable_parameters(create_model("cnn", 1, 10, 28))
    curve = client_gflops_curve(enc, head_step, full_step, epochs=5)
    assert [c["epoch"] for c in curve] == [1, 2, 3, 4, 5]
    assert curve[-1]["fedage_gflops"] < curve[-1]["full_gflops"]
    step = curve[1]["fedage_gflops"] - curve[0]["fedage_gflops"]
    assert abs(step - head_step / 1e9) < 1e-15


def test_cost_command_writes_json_and_plot(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    out = tmp_path / "cost"
    args = ["encoder", "cost", "--encoder", "random:dim=16", "--out", str(out), "--full", "mlp"]
    result = CliRunner().invoke(app, [*args, "--backbone", "resnet18@32", "dataset=digits"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "cost.json").read_text())
    assert (out / "cost.png").stat().st_size > 0
    assert doc["encoder"]["trainable_parameters"] == 0
    fedage, full = doc["fedage"]["total_gflops_per_sample"], doc["full"]["models"]["mlp"]
    head_step = doc["head"]["train_step_flops_per_sample"]
    enc = doc["encoder"]["forward_flops_per_sample"]
    assert abs(fedage - (enc + 7 * head_step) / 1e9) < 1e-15  # encoder once, 7 head epochs
    assert doc["ratio_full_over_fedage"]["mlp"] == full["total_gflops_per_sample"] / fedage
    assert len(doc["curves"]["mlp"]) == 7  # max(head epochs 7, local epochs 5)
    assert doc["backbones"]["resnet18@32"]["forward_flops_per_sample"] > enc
    bad = CliRunner().invoke(app, [*args, "--backbone", "resnet99", "dataset=digits"])
    assert bad.exit_code != 0 and "resnet99" in bad.output
