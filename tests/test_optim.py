"""The training layer's optimisers (``oneshotfl.training.optim``) are torch's, bit for bit,
without importing torch's compiler: a client's update in a fresh process (a Flower ClientApp)
leaves ``torch._dynamo`` unloaded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from oneshotfl.training import optim

CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "betas": (0.5, 0.99), "weight_decay": 1e-3}),
    ("AdamW", {"lr": 1e-2, "weight_decay": 1e-2}),
]


def _train(make: Callable[..., torch.optim.Optimizer], closure: bool, **kw: Any) -> Any:
    """Six steps on a small MLP, the last three after a state_dict round trip into a new
    optimiser of the same kind; the parameters and the optimiser's state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))

    def loss() -> float:
        opt.zero_grad()
        out = torch.nn.functional.cross_entropy(model(x), y)
        out.backward()
        return float(out.detach())

    opt = make(model.parameters(), **kw)
    for step in range(6):
        if step == 3:
            state = opt.state_dict()
            opt = make(model.parameters(), **kw)
            opt.load_state_dict(state)
        if closure:
            opt.step(loss)
        else:
            loss()
            opt.step()
    return [p.detach().clone() for p in model.parameters()], opt.state_dict()["state"]


@pytest.mark.parametrize("closure", [False, True])
@pytest.mark.parametrize(("name", "kw"), CASES)
def test_the_optimisers_are_torchs_bit_for_bit(
    name: str, kw: dict[str, Any], closure: bool
) -> None:
    ours, theirs = getattr(optim, name), getattr(torch.optim, name)
    assert issubclass(ours, theirs)  # LR schedulers and type checks take them
    got, got_state = _train(ours, closure, **kw)
    want, want_state = _train(theirs, closure, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert got_state.keys() == want_state.keys()
    for key, entry in want_state.items():
        for field, value in entry.items():
            assert torch.equal(torch.as_tensor(got_state[key][field]), torch.as_tensor(value))


def test_the_optimisers_leave_gradients_as_torchs_do() -> None:
    """``step`` runs without building a graph, as torch's decorator has it, and restores the
    caller's grad mode; ``zero_grad`` sets gradients to None by default."""
    weight = torch.nn.Parameter(torch.ones(3))
    opt = optim.SGD([weight], lr=0.1)
    (weight * 2).sum().backward()
    with torch.enable_grad():
        opt.step()
        assert torch.is_grad_enabled()
    assert not weight.grad_fn and torch.equal(weight.detach(), torch.full((3,), 0.8))
    opt.zero_grad()
    assert weight.grad is None


def test_a_client_update_in_a_fresh_process_leaves_torchs_compiler_unloaded() -> None:
    """What a Flower ClientApp process does for FedAvg and FOL's receiver weights: local
    training and an Adam fit. torch.optim's own classes import torch._dynamo (about 2 CPU-s
    in each new process); the training layer's must not."""
    code = (
        "import sys, torch\n"
        "from helpers import TINY, prepare\n"
        "from oneshotfl.methods import build_method\n"
        "from oneshotfl.runner.config import make_config\n"
        "fed = prepare(make_config({**TINY, 'methods': ['fedavg'], 'cache_dir': ''}))\n"
        "build_method('fedavg').client_update(fed.client_context(0))\n"
        "from oneshotfl.training.optim import Adam\n"
        "v = torch.zeros(3, requires_grad=True)\n"
        "opt = Adam([v], lr=0.1)\n"
        "(v - 1).pow(2).sum().backward(); opt.step()\n"
        "print('torch._dynamo' in sys.modules)"
    )
    tests = str(Path(__file__).parent)
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {tests!r})\n{code}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "False"
