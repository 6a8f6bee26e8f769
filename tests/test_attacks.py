"""The inversion audit: metrics by hand, the positive control is inverted, the command runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from typer.testing import CliRunner

from oneshotfl.cli.main import app
from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders import build_encoder
from oneshotfl.security.inversion import invert, psnr, ssim, to_unit_range, total_variation

TASK = TaskInfo("digits", 10, 1, 8)


def test_metrics_by_hand() -> None:
    x = torch.zeros(1, 1, 4, 4)
    y = torch.full((1, 1, 4, 4), 0.1)
    assert math.isclose(float(psnr(x, y)), 20.0, rel_tol=1e-5)  # MSE 0.01 → 20 dB
    assert float(psnr(x, x)) == 100.0
    img = torch.rand(2, 1, 8, 8)
    assert torch.allclose(ssim(img, img), torch.ones(2), atol=1e-5)
    assert float(ssim(img, 1 - img).mean()) < 0.5
    step = torch.zeros(1, 1, 2, 2)
    step[..., 1] = 1.0
    assert float(total_variation(step)) == 2.0  # two horizontal jumps of 1


def test_identity_control_is_inverted_and_random_is_not_trivially() -> None:
    x = torch.randn(3, 1, 8, 8)
    identity = build_encoder("identity", TASK, 0)
    recon = invert(identity, identity.embed(x, torch.device("cpu")), (1, 8, 8), steps=150)
    unit = to_unit_range(x, "digits")
    assert float(psnr(to_unit_range(recon, "digits"), unit).mean()) >= 25.0


def test_attack_command_writes_metrics_and_grid(tmp_path: Path) -> None:
    out = tmp_path / "attack"
    args = ["encoder", "attack", "--encoder", "identity", "--out", str(out), "--samples", "3"]
    done = CliRunner().invoke(
        app, [*args, "--steps", "100", "--epsilons", "none,4", "dataset=digits", "cache_dir="]
    )
    assert done.exit_code == 0, done.output
    doc = json.loads((out / "metrics.json").read_text())
    clean, private = doc["results"]
    assert clean["epsilon"] is None and clean["psnr_db"] >= 25.0
    assert private["epsilon"] == 4.0 and private["psnr_db"] < clean["psnr_db"]
    assert (out / "grid.png").stat().st_size > 1000
