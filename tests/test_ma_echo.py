"""MA-Echo: the projector update, the echo step, the class-split average, the payload's
bounded shapes, and runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers import prepare, run_config
from oneshotfl.functional import ma_echo_consensus_step, projection_update
from oneshotfl.methods import build_method, parse_method_spec
from oneshotfl.methods.ma_echo import MAEcho, _class_split_average, client_projections
from oneshotfl.methods.ma_echo import MAEchoConfig as Config
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import PayloadError, task_dims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.training.services import train_model

VARIANTS = ["ma_echo:iterations=3", "ma_echo:iterations=3:bias=average:normalise=true"]


def test_one_projection_step_is_the_closed_form() -> None:
    r = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    p = projection_update(torch.eye(3, dtype=torch.float64), r, 0.5, 0.1)
    want = torch.eye(3, dtype=torch.float64) - 0.5 * torch.outer(r, r) / (0.1 + r @ r)
    assert torch.allclose(p, want)


def test_the_projector_removes_the_span_of_the_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(2, 6, generator=g, dtype=torch.float64)
    p = torch.eye(6, dtype=torch.float64)
    for _ in range(50):
        p = projection_update(
            p, torch.randn(2, generator=g, dtype=torch.float64) @ basis, 1.0, 1e-6
        )
    inside, outside = basis[0], torch.linalg.svd(basis).Vh[-1]  # in the span / orthogonal to it
    assert float((p @ inside).norm()) < 1e-3 * float(inside.norm())
    assert torch.allclose(p @ outside, outside, atol=1e-6)


def test_an_echo_step_leaves_a_lone_client_unchanged() -> None:
    w = torch.randn(4, 3)
    p = torch.eye(3) * 0.5
    consensus, (moved,) = ma_echo_consensus_step(w.clone(), [w], [p], torch.eye(3), 1.6, False)
    assert torch.allclose(consensus, w) and torch.allclose(moved, w)


def test_class_split_average_by_hand() -> None:
    states = [
        {"head.weight": torch.tensor([[1.0], [10.0]]), "body": torch.tensor([1.0])},
        {"head.weight": torch.tensor([[3.0], [20.0]]), "body": torch.tensor([3.0])},
    ]
    holds = torch.tensor([[True, False], [True, False]])  # class 1: nobody → everyone
    out = _class_split_average(states, holds)
    assert torch.allclose(out["head.weight"], torch.tensor([[2.0], [15.0]]))
    holds = torch.tensor([[True, True], [False, True]])  # class 0 only client 0
    out = _class_split_average(states, holds)
    assert torch.allclose(out["head.weight"], torch.tensor([[1.0], [15.0]]))
    assert torch.allclose(out["body"], torch.tensor([2.0]))


def test_the_payload_spec_bounds_every_projection(tiny_config: Any) -> None:
    exp = prepare(tiny_config(methods=[VARIANTS[0]]))
    method = build_method(VARIANTS[0])
    payload = method.client_update(exp.client_context(0))
    spec = method.payload_spec(exp.dims)
    validate_payload(payload, spec, exp.dims)
    shapes = {a.name: a.shape for a in spec.arrays}
    assert shapes["proj.features.1"] == (8 * 8 + 1, 8 * 8 + 1)  # mlp: 64 inputs + bias
    bad = Payload({**payload.arrays, "proj.features.1": torch.eye(3).numpy()}, payload.scalars)
    with pytest.raises(PayloadError, match=r"proj\.features\.1"):
        validate_payload(bad, spec, exp.dims)
    assert [a.name for a in method.payload_spec(task_dims(exp.data.task)).arrays] == ["classes"]


def test_one_client_gets_its_own_model_back(tiny_config: Any) -> None:
    exp = prepare(tiny_config(methods=[VARIANTS[0]]))
    method = build_method(VARIANTS[0])
    assert isinstance(method, MAEcho)
    ctx = exp.client_context(0)
    payload = method.client_update(ctx)
    own = train_model(ctx, ctx.recipe()).state_dict()
    got = method.aggregate({0: payload}, exp.server_view().server_context(method.requires)).model  # type: ignore[union-attr]
    assert all(torch.allclose(own[k].cpu(), v, atol=1e-5) for k, v in got.state_dict().items())


def test_projections_of_a_convolution_have_its_patch_width() -> None:
    model = create_model("cnn", 1, 3, 8).eval()
    proj = client_projections(model, torch.randn(20, 1, 8, 8), Config(), torch.Generator())
    for name, p in proj.items():
        assert p.shape[0] == p.shape[1] and torch.isfinite(p).all(), name


def test_every_variant_runs(tiny_config: Any) -> None:
    rows = {m["key"]: m for m in run_config(tiny_config(methods=VARIANTS))["methods"]}
    for key in (parse_method_spec(v).key for v in VARIANTS):
        assert 0.0 <= rows[key]["accuracy"] <= 1.0
