"""The authors' FAFI client step, as ``benchmarks/authors/fafi_authors_client.py`` runs it (their
``ours_local_training`` and driver lines unedited), really runs their function with their
loader's quirk (``drop_last``: a client smaller than one batch takes no step), sends ``fafi``'s
message, learns the tiny digits federation and repeats bit for bit. It needs a checkout named
by ``FAFI_REPO`` and is skipped, naming it, without one."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from fingerprints import Recording
from helpers import make_server_context, prepare, run_over
from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.methods import build_method
from oneshotfl.methods.fafi import Fafi
from oneshotfl.models import create_model
from oneshotfl.models.base import ClassifierModel
from oneshotfl.payload import decode
from oneshotfl.protocol.outcome import GlobalModel
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.transport import LocalTransport
from oneshotfl.seeding import seeded_torch
from oneshotfl.training.loop import TrainConfig
from test_authors_dedes_regmean import authors_plugin

CHECKOUT = ("FAFI_REPO", "zenghui9977/FAFI_ICML25")
PLUGIN = Path(__file__).resolve().parents[1] / "benchmarks" / "authors" / "fafi_authors_client.py"
TASK = TaskInfo("digits", 10, 1, 8)


@pytest.fixture
def mod(forget: list[str], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    forget.append("fafi_authors")  # the server plugin it loads
    return authors_plugin("fafi_authors_client", CHECKOUT, forget, monkeypatch)


def digits_like(n: int) -> LabelledData:
    gen = torch.Generator().manual_seed(n)
    return LabelledData(torch.randn(n, 1, 8, 8, generator=gen), torch.arange(n) % 10)


def test_their_function_runs_and_a_client_smaller_than_a_batch_takes_no_step(
    mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call of the plugin's client step is a call of the function compiled from their
    ``our_local_training.py``; their ``drop_last`` loader takes n // B steps an epoch (``fafi``
    takes ⌈n / B⌉), none below one batch, where the client keeps the shared initial model and
    ``fafi``'s prototypes."""
    calls: list[str] = []
    loaded = mod.authors_definitions

    def spied(env: str, file: str, names: tuple[str, ...], scope: dict[str, Any]) -> Any:
        found = loaded(env, file, names, scope)
        if "ours_local_training" in names:
            theirs = found["ours_local_training"]

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls.append(theirs.__code__.co_filename)
                return theirs(*args, **kwargs)

            found["ours_local_training"] = counted
        return found

    monkeypatch.setattr(mod, "authors_definitions", spied)
    train = TrainConfig(epochs=2, batch_size=32, lr=0.05)

    def initial() -> ClassifierModel:
        torch.manual_seed(0)
        model = create_model("mlp", 1, 10, 8)
        assert isinstance(model, ClassifierModel)
        return model

    def step(n: int) -> tuple[Any, Any]:
        """Client 3 of n examples (seed 0) from :func:`initial`, an epoch a call."""
        cpu = torch.device("cpu")
        return mod.authors_client_step(initial(), digits_like(n), TASK, train, 1, 0, "mlp", 3, cpu)

    shape = initial().head.weight.shape
    with seeded_torch(0, "init", "mlp", "fafi prototypes"):  # fafi's draw
        prototypes = torch.randn(shape)

    model, trace = step(70)
    theirs = str(Path(os.environ["FAFI_REPO"]) / "oneshot_algorithms/ours/our_local_training.py")
    assert calls == [theirs, theirs] and trace.calls == 2  # one call an epoch
    assert trace.steps == 2 * (70 // 32)  # 4; fafi's loader: 2 * 3
    facts = trace.facts()
    assert facts["authors_untrained"] == 0.0 and facts["authors_final_epoch_loss"] > 0
    assert not torch.equal(model.head.weight, prototypes)

    calls.clear()
    small, trace = step(20)
    assert calls == [theirs] and trace.steps == 0 and trace.untrained  # their test_acc / 0
    assert torch.equal(small.head.weight, prototypes) and not small.head.bias.any()
    fresh = initial().state_dict()
    kept = {k: v for k, v in small.state_dict().items() if not k.startswith("head.")}
    assert kept and all(torch.equal(v, fresh[k]) for k, v in kept.items())


def test_a_tiny_run_sends_fafis_message_learns_and_repeats_bit_for_bit(
    mod: ModuleType, tiny_config: Any
) -> None:
    """Digits, 3 ``cnn`` clients, 3 epochs, twice from scratch: each client's bytes pass
    ``fafi``'s payload checks, each client called their function once an epoch and stepped
    n_k // B times, the fused model beats chance, and the second run's bytes and predictions
    are the first's."""
    cfg = tiny_config(plugins=[str(PLUGIN)], methods=["fafi_authors_client"], model="cnn",
                      local_epochs=3, cache_dir="")  # fmt: skip
    runs = []
    for _ in range(2):
        fed = prepare(cfg)
        transport = Recording(LocalTransport(fed))
        method = build_method("fafi_authors_client")
        result = run_over("fafi_authors_client", method, fed, transport).to_dict()
        runs.append((transport.sent, result, fed, method))
    (sent, result, fed, method), (sent_b, result_b, _, _) = runs
    spec = Fafi().payload_spec(fed.dims)
    assert method.payload_spec(fed.dims) == spec
    payloads = {c: decode(data) for c, data in sorted(sent.items())}
    for c, payload in payloads.items():
        validate_payload(payload, spec, fed.dims, c)
    sizes = [int(p.scalars["n_examples"]) for p in payloads.values()]
    facts = result["client_facts"]
    assert facts["authors_calls"] == [3.0] * 3
    assert facts["authors_steps"] == [3.0 * (n // 32) for n in sizes]
    assert result["accuracy"] > 0.25, result["accuracy"]  # chance: 0.1 (0.43 here)

    assert sent == sent_b
    for key in ("accuracy", "per_class_accuracy", "client_facts"):
        assert result[key] == result_b[key], key
    ctx = make_server_context(fed.data.task, client_archs=("cnn",) * 3)
    outcomes = [method.aggregate({c: decode(d) for c, d in s.items()}, ctx) for s in (sent, sent_b)]
    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [o.model(x) for o in outcomes if isinstance(o, GlobalModel)]
    assert len(logits) == 2 and torch.equal(logits[0], logits[1])
