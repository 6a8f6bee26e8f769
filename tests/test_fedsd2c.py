"""FedSD2C: the Fourier amplitude mix, the V-information core-set, the crops, the latent
synthesis, the message checked on the wire, the server leaving out latents of another
autoencoder, and the method learning small data."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import oneshotfl
from oneshotfl.data.types import LabelledData, TaskInfo, UnlabelledData
from oneshotfl.encoders.autoencoder import build_autoencoder
from oneshotfl.methods.fedsd2c import (
    FedSd2c,
    apply_crops,
    core_set,
    crop_boxes,
    fourier_amplitude_mix,
    synthesize,
    vinfo_coreset,
)
from oneshotfl.methods.fedsd2c_config import FedSd2cConfig
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.protocol.wire import byte_limit
from oneshotfl.training.loop import TrainConfig

TASK = TaskInfo("digits", 10, 1, 8)
AE = "public:channels=2:width=8:min_steps=50"
AE_KNOBS = {"ae_width": 16, "ae_min_steps": 300}  # ae_downsample auto: 2 on 8-pixel digits


def test_fourier_mix_keeps_the_phase_and_mixes_the_amplitude() -> None:
    gen = torch.Generator().manual_seed(0)
    x_s, x_d = torch.randn(4, 1, 8, 8, generator=gen), torch.randn(4, 1, 8, 8, generator=gen)
    assert torch.allclose(fourier_amplitude_mix(x_s, x_d, 0.0), x_s, atol=1e-5)
    assert torch.allclose(fourier_amplitude_mix(x_s, x_s, 0.8), x_s, atol=1e-5)
    mixed = torch.fft.fft2(fourier_amplitude_mix(x_s, x_d, 0.8))
    spectrum_s, spectrum_d = torch.fft.fft2(x_s), torch.fft.fft2(x_d)
    want = 0.2 * spectrum_s.abs() + 0.8 * spectrum_d.abs()
    assert torch.allclose(mixed.abs(), want, atol=1e-4)
    strong = want > 1e-3  # the phase of a (near-)zero coefficient is undefined
    turn = torch.polar(torch.ones_like(want), mixed.angle() - spectrum_s.angle())
    assert torch.allclose(turn[strong], torch.ones_like(turn[strong]), atol=1e-3)


def test_the_coreset_keeps_each_examples_best_crop_and_the_least_cross_entropy() -> None:
    ce = torch.tensor([[3.0, 0.5, 2.0], [0.1, 0.9, 0.8], [2.0, 2.5, 1.5], [0.7, 0.3, 0.4]])
    chosen, best_crop, best_ce = vinfo_coreset(ce, 2)
    assert best_crop.tolist() == [1, 0, 2, 1]
    assert torch.allclose(best_ce, torch.tensor([0.5, 0.1, 1.5, 0.3]))
    assert chosen.tolist() == [1, 3]  # ascending best cross-entropy, the ipc first


def test_crops_lie_in_the_image_and_a_whole_crop_is_the_image() -> None:
    boxes = crop_boxes(500, 0.25, torch.Generator().manual_seed(0))
    side = boxes[:, 0, 0]
    assert float(side.min()) >= 0.5 - 1e-6 and float(side.max()) <= 1.0
    assert bool((boxes[:, :, 2].abs() <= (1 - side)[:, None] + 1e-6).all())  # inside the image
    assert torch.equal(boxes[:, 0, 0], boxes[:, 1, 1])  # square
    x = torch.rand(3, 1, 8, 8)
    whole = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    crops = apply_crops(x, torch.cat([whole, boxes[:2]]))
    assert crops.shape == (3, 3, 1, 8, 8)
    assert torch.allclose(crops[:, 0], x, atol=1e-6)


def client_context(n_per_class: list[int], **cfg: Any) -> tuple[ClientContext, Any]:
    gen = torch.Generator().manual_seed(0)
    y = torch.cat([torch.full((n,), c, dtype=torch.long) for c, n in enumerate(n_per_class)])
    x = torch.randn(len(y), 1, 8, 8, generator=gen) + y.view(-1, 1, 1, 1) * 0.3
    public = UnlabelledData(torch.randn(64, 1, 8, 8, generator=gen))
    ctx = ClientContext(0, LabelledData(x, y), None, TASK, "mlp", TrainConfig(epochs=1), public,
                        torch.device("cpu"), 0)  # fmt: skip
    torch.manual_seed(0)
    return ctx, create_model("mlp", 1, 10, 8).eval()


@pytest.mark.parametrize("small", ["keep", "drop"])
def test_the_coreset_sends_at_most_ipc_a_class_and_drops_small_classes_only_if_told(
    small: Any,
) -> None:
    ctx, model = client_context([12, 3, 7])
    cfg = FedSd2cConfig(ipc=5, num_crop=3, small_classes=small)
    x_s, x_p, y = core_set(model, ctx.data, cfg, ctx, torch.device("cpu"))
    counts = np.bincount(y.numpy(), minlength=3).tolist()
    assert counts == ([5, 3, 5] if small == "keep" else [5, 0, 5])
    assert x_s.shape == x_p.shape == (len(y), 1, 8, 8)
    assert not torch.equal(x_s, x_p)  # perturbed
    again = core_set(model, ctx.data, cfg, ctx, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip((x_s, x_p, y), again, strict=True))
    unmixed = core_set(model, ctx.data, dataclasses.replace(cfg, fourier=False), ctx,
                       torch.device("cpu"))  # fmt: skip
    assert torch.equal(unmixed[0], unmixed[1]) and torch.equal(unmixed[0], x_s)


def test_synthesis_starts_at_the_encoding_and_lowers_its_loss() -> None:
    ctx, model = client_context([20, 20])
    auto = build_autoencoder(AE, TASK, 0, public=ctx.public.x if ctx.public else None)
    cfg = FedSd2cConfig(ipc=4, num_crop=2)
    x_s, x_p, y = core_set(model, ctx.data, cfg, ctx, torch.device("cpu"))
    for p in model.parameters():
        p.requires_grad_(False)
    z0, _ = synthesize(model, auto, x_p, x_s, y, dataclasses.replace(cfg, iterations=0), ctx.device)
    with torch.no_grad():
        assert torch.equal(z0, auto.model.encode(x_p))
    z, (first, last) = synthesize(model, auto, x_p, x_s, y, dataclasses.replace(cfg, iterations=30),
                                  ctx.device)  # fmt: skip
    assert z.shape == z0.shape == (len(y), 2, 2, 2) and not torch.equal(z, z0)
    assert last < first


def test_the_message_is_bounded_and_checked_on_the_wire() -> None:
    method = FedSd2c(FedSd2cConfig(ipc=3, ae_channels=2, ae_downsample=4))
    dims = WireDims(num_classes=4, in_channels=1, image_size=8)
    spec = method.payload_spec(dims)
    rng = np.random.default_rng(0)

    def payload(n: int, **change: np.ndarray) -> Payload:
        arrays = {"distillates.latents": rng.normal(size=(n, 2, 2, 2)).astype(np.float32),
                  "distillates.y": np.arange(n, dtype=np.int64) % 4,
                  "distillates.logits": rng.normal(size=(n, 2, 4)).astype(np.float32)}  # fmt: skip
        arrays.update({f"distillates.{k}": v for k, v in change.items()})
        return Payload(arrays, {"autoencoder": "abc"})

    for n in (1, 5, 12):  # N varies by client, up to ipc·C
        validate_payload(payload(n), spec, dims, 7)
    bad = {
        "at most ipc = 3 of a class": payload(4, y=np.zeros(4, np.int64)),
        "1 <= N <= ipc·C = 12": payload(13),
        r"labels in \[0, 3\]": payload(2, y=np.array([0, 4])),
        "float32 \\(2, 2, 2, 2\\)": payload(2, latents=np.zeros((2, 3, 2, 2), np.float32)),
        "finite values": payload(2, logits=np.full((2, 2, 4), np.nan, np.float32)),
        r"\|z\| <= 10000": payload(2, latents=np.full((2, 2, 2, 2), 1e6, np.float32)),
        "no such array": payload(2, extra=np.zeros(2, np.float32)),
        "int64": payload(2, y=np.array([0, 1], np.int32)),
    }
    for message, sent in bad.items():
        with pytest.raises(PayloadError, match=f"client 7: .*{message}"):
            validate_payload(sent, spec, dims, 7)
    missing = payload(2)
    del missing.arrays["distillates.logits"]
    with pytest.raises(PayloadError, match=r"'distillates\.logits': expected an array"):
        validate_payload(missing, spec, dims, 7)
    from oneshotfl.protocol.wire import HEADER_ALLOWANCE

    # ipc·C rows of (latent floats, a label, two logit rows), three tensors
    rows = 12 * (8 * 4 + 8 + 2 * 4 * 4)
    assert byte_limit(spec, dims) == HEADER_ALLOWANCE + rows + 3 * 256
    hard = FedSd2c(FedSd2cConfig(ipc=3, labels="hard", ae_channels=2, ae_downsample=4))
    del missing.arrays["distillates.latents"]
    with pytest.raises(PayloadError, match=r"distillates\.latents"):
        validate_payload(missing, hard.payload_spec(dims), dims, 7)


def test_fedsd2c_learns_small_data_and_leaves_out_another_autoencoders_latents(
    tiny_config: Any,
) -> None:
    knobs = ":".join(f"{k}={v}" for k, v in AE_KNOBS.items())
    key = f"fedsd2c:ipc=10:iterations=10:server_epochs=20:{knobs}"
    cfg = tiny_config(methods=[key], model="cnn", local_epochs=3, public_size=200)
    result = oneshotfl.run(cfg)
    (sd2c,) = result.methods
    assert sd2c.accuracy > 0.5, sd2c.accuracy
    assert sd2c.diagnostics["clients_used"] == 3 and "left_out" not in sd2c.diagnostics

    from helpers import make_server_context

    method = FedSd2c(FedSd2cConfig(ipc=2, server_epochs=1, **AE_KNOBS))
    ctx = make_server_context(TASK, public=UnlabelledData(torch.randn(64, 1, 8, 8)))
    auto = method.autoencoder(ctx)
    assert auto.latent_shape(8) == (4, 4, 4)
    arrays = {"distillates.latents": np.zeros((2, 4, 4, 4), np.float32),
              "distillates.y": np.array([0, 1]),
              "distillates.logits": np.zeros((2, 2, 10), np.float32)}  # fmt: skip
    payloads = {0: Payload(arrays, {"autoencoder": auto.fingerprint}),
                1: Payload(arrays, {"autoencoder": "0" * 64})}  # fmt: skip
    outcome = method.aggregate(payloads, ctx)
    assert outcome.info["clients_used"] == 1 and list(outcome.info["left_out"]) == ["client 1"]
    with pytest.raises(ValueError, match="no client sent latents of this run's autoencoder"):
        method.aggregate({1: payloads[1]}, ctx)
