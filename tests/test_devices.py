"""Device-clean code without a GPU (issue 34): SimCLR's NT-Xent made its targets on the CPU,
and a CUDA run of the demo failed there. :class:`oneshotfl.devices.DeviceAudit` finds such
tensors on a CPU run; the contract suite audits every registered method
(``tests/test_contract.py``), this file the audit itself and the demo's config."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import run_config, tiny_demo
from oneshotfl.devices import DeviceAudit
from oneshotfl.encoders.pretrain import nt_xent

HERE = str(Path(__file__).resolve().parent)


def nt_xent_before(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent as it was before issue 34: its targets made without a device."""
    z = F.normalize(torch.cat([a, b]), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))
    n = len(a)
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(sim, targets)


def test_nt_xent_makes_its_targets_on_the_views_device() -> None:
    """The meta device stands in for a GPU: tensors on it meet no CPU tensor silently."""
    a, b = torch.randn(6, 4, device="meta"), torch.randn(6, 4, device="meta")
    assert nt_xent(a, b, 0.5).device.type == "meta"
    with pytest.raises(RuntimeError, match="device"):
        nt_xent_before(a, b, 0.5)


def test_the_audit_names_a_tensor_made_without_a_device_and_changes_nothing() -> None:
    a = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    b = a.detach() + 0.1
    with DeviceAudit(roots=[HERE]) as audit:
        before = nt_xent_before(a, b, 0.5)
        before.backward()
    made = inspect.getsourcelines(nt_xent_before)[1] + 6  # its `targets = ...` line
    assert [str(s) for s in audit.slips] == [
        f"a tensor made at test_devices.py:{made} in nt_xent_before without a device met the "
        f"run's tensors in cross_entropy at test_devices.py:{made + 1} in nt_xent_before"
    ]
    with DeviceAudit(roots=[HERE]) as audit:
        after = nt_xent(a, b, 0.5)
        index = torch.randperm(6)  # CPU indices are taken by every device
        scale = torch.tensor(2.0)  # so is a 0-dim tensor
        placed = torch.ones(6).to(a.device)  # a tensor moved to the device has its home
        _ = a[index] * scale + placed.unsqueeze(1)
    assert audit.slips == []
    assert torch.equal(before, after) and torch.equal(after, nt_xent(a, b, 0.5))


def test_the_demo_config_is_device_clean_at_a_tiny_budget(tmp_path: Path) -> None:
    """The demo's every method — SimCLR's encoder, FedAGE, FedEOV, IntactOFL, FOL… — on a
    few hundred images, audited from data to evaluation."""
    cfg = tiny_demo(tmp_path / "cache", dataset="digits", max_train=600, public_size=120)
    with DeviceAudit() as audit:
        doc = run_config(cfg)
    assert audit.slips == [], "\n".join(map(str, audit.slips))
    assert all(m["clients_used"] for m in doc["methods"]), doc["methods"]
