"""Shared frozen encoders: the registry, the real weight-loading path, preprocessing, caching."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import check, prepare
from oneshotfl.data.datasets import DATASETS
from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders import EncoderError, build_encoder, parse_encoder_spec
from oneshotfl.encoders.base import Preprocess, preprocess_images
from oneshotfl.encoders.sources import IMAGENET_MEAN, IMAGENET_STD, cached_weights_path
from oneshotfl.methods.common import client_embeddings
from oneshotfl.protocol.contract import Method, Requires
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import RequirementError

TASK = TaskInfo("digits", 10, 1, 8)


def test_random_encoder_is_frozen_seeded_and_shaped() -> None:
    a, b = build_encoder("random", TASK, 0), build_encoder("random", TASK, 0)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert build_encoder("random", TASK, 1).fingerprint != a.fingerprint
    assert all(not p.requires_grad for p in a.module.parameters())
    z = a.embed(torch.randn(5, 1, 8, 8), torch.device("cpu"), batch_size=2)
    assert z.shape == (5, 64) and z.dtype == torch.float32
    assert build_encoder("random:dim=16:width=4", TASK, 0).embed(
        torch.randn(3, 1, 8, 8), torch.device("cpu")
    ).shape == (3, 16)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (
            "nope",
            "unknown encoder 'nope'; expected one of: file, identity, random, simclr, torchvision",
        ),
        ("random:depth=3", "unknown option\\(s\\) \\['depth'\\]"),
        ("random:dim=big", "option dim='big' is not valid"),
        ("random:dim", "expected key=value, got 'dim'"),
        ("torchvision:arch=alexnet", "expected arch in"),
    ],
)
def test_bad_encoder_specs_say_what_was_expected(spec: str, match: str) -> None:
    with pytest.raises(EncoderError, match=match):
        build_encoder(spec, TASK, 0)


def test_parse_encoder_spec() -> None:
    assert parse_encoder_spec("torchvision:arch=vgg19:size=64") == (
        "torchvision",
        {"arch": "vgg19", "size": "64"},
    )


def test_preprocessing_renormalises_to_imagenet() -> None:
    spec = DATASETS.get("fashion_mnist")
    task = TaskInfo("fashion_mnist", 10, 1, 28)
    value = (0.5 - spec.mean[0]) / spec.std[0]  # a dataset-normalised grey pixel of 0.5
    x = torch.full((1, 1, 28, 28), value)
    pre = Preprocess(size=32, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    out = preprocess_images(x, pre, task)
    assert out.shape == (1, 3, 32, 32)
    expected = [(0.5 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)]
    assert torch.allclose(out[0, :, 5, 5], torch.tensor(expected), atol=1e-5)


@pytest.fixture
def resnet18_weights(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "resnet18.pth"
    import torchvision  # ~2 s: imported by the one test that needs it

    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


def test_torchvision_encoder_loads_a_local_weights_file(resnet18_weights: Path) -> None:
    spec = f"torchvision:arch=resnet18:weights={resnet18_weights}:size=32"
    encoder = build_encoder(spec, TASK, 0)
    z = encoder.embed(torch.randn(4, 1, 8, 8), torch.device("cpu"))
    assert z.shape == (4, 512) and encoder.dim == 512
    assert encoder.info["weights"] == str(resnet18_weights)
    assert build_encoder(spec, TASK, 0).fingerprint == encoder.fingerprint
    state = torch.load(resnet18_weights, weights_only=True)
    state["fc.bias"] += 1.0
    other = resnet18_weights.with_name("other.pth")
    torch.save(state, other)
    changed = build_encoder(f"torchvision:arch=resnet18:weights={other}:size=32", TASK, 0)
    assert changed.fingerprint != encoder.fingerprint  # the weights are part of the hash


def test_torchvision_encoder_errors_name_the_file(resnet18_weights: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pth"
    with pytest.raises(EncoderError, match=r"not found at .*missing\.pth"):
        build_encoder(f"torchvision:arch=resnet18:weights={missing}", TASK, 0)
    with pytest.raises(EncoderError, match="is not a mobilenet_v2 state dict"):
        build_encoder(f"torchvision:arch=mobilenet_v2:weights={resnet18_weights}", TASK, 0)


def test_torchvision_encoder_finds_the_torch_cache(
    resnet18_weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cached = cached_weights_path("resnet18")
    assert cached.name == "resnet18-f37072fd.pth"
    with pytest.raises(EncoderError, match="torch"):
        build_encoder("torchvision:arch=resnet18:size=32", TASK, 0)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(resnet18_weights.read_bytes())
    assert build_encoder("torchvision:arch=resnet18:size=32", TASK, 0).dim == 512


class NeedsEncoder(Method[Any]):
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: Any) -> Any:
        raise NotImplementedError

    def client_update(self, ctx: Any) -> Any:
        raise NotImplementedError

    def aggregate(self, payloads: Any, ctx: Any) -> Any:
        raise NotImplementedError


def test_runner_builds_the_encoder_and_caches_embeddings(tiny_config: Any) -> None:
    setup = prepare(tiny_config(methods=["local"]))
    with pytest.raises(RequirementError, match="needs a shared frozen encoder"):
        check(setup, [("x", NeedsEncoder())])
    setup = prepare(tiny_config(methods=["local"], encoder="random:dim=8"))
    check(setup, [("x", NeedsEncoder())])
    ctx = setup.client_context(0)
    z = client_embeddings(ctx)
    assert z.shape == (len(ctx.data), 8) and (setup.store.misses, setup.store.hits) == (1, 0)
    again = setup.client_context(0)
    assert torch.equal(client_embeddings(again), z) and setup.store.hits == 1
    with pytest.raises(ConfigError, match="unknown encoder"):
        prepare(tiny_config(methods=["local"], encoder="imagenet"))


def test_simclr_pieces() -> None:
    from oneshotfl.encoders.pretrain import augment, nt_xent

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 8, 8)
    a, b = augment(x, g), augment(x, g)
    assert a.shape == x.shape and not torch.allclose(a, b)
    z = torch.randn(4, 3)
    aligned = nt_xent(z, z, 0.5)  # both views identical: the easiest case
    shuffled = nt_xent(z, z[torch.tensor([1, 2, 3, 0])], 0.5)
    assert float(aligned) < float(shuffled)


def test_pretrain_save_load_and_hash_checks(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from oneshotfl.encoders.pretrain import (
        PretrainConfig,
        pretrain_encoder,
        read_metadata,
        save_encoder,
    )

    images = torch.randn(40, 1, 8, 8)
    cfg = PretrainConfig(dim=8, width=4, epochs=2, batch_size=16)
    module, losses = pretrain_encoder(images, TASK, cfg, torch.device("cpu"))
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    path = tmp_path / "enc.safetensors"
    digest = save_encoder(module, path, {"arch": "conv", "dim": 8, "width": 4, "in_channels": 1})
    assert read_metadata(path)["content_hash"] == digest
    encoder = build_encoder(f"file:path={path}:sha256={digest}", TASK, 0)
    assert encoder.fingerprint == digest and encoder.dim == 8
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(encoder.embed(x, torch.device("cpu")), module(x))
    with pytest.raises(EncoderError, match="requested hash"):
        build_encoder(f"file:path={path}:sha256=0000", TASK, 0)
    state = load_file(str(path))
    state[sorted(state)[0]] += 1.0  # tamper with the weights, keep the metadata
    tampered = tmp_path / "tampered.safetensors"
    save_file(state, str(tampered), metadata=_raw_meta(path))
    with pytest.raises(EncoderError, match="stored hash"):
        build_encoder(f"file:path={tampered}", TASK, 0)
    with pytest.raises(EncoderError, match="built for 1 input channels, the task has 3"):
        build_encoder(f"file:path={path}", TaskInfo("cifar10", 10, 3, 32), 0)
    with pytest.raises(EncoderError, match="expected path=FILE"):
        build_encoder("file", TASK, 0)


def test_simclr_source_pretrains_on_the_public_pool_once(tmp_path: Path) -> None:
    from oneshotfl.encoders.pretrain import PretrainConfig, pretrain_encoder
    from oneshotfl.training.artefacts import ArtefactStore

    pool = torch.randn(32, 1, 8, 8)
    spec = "simclr:dim=8:width=4:epochs=2:batch_size=16"
    store = ArtefactStore(tmp_path / "cache")
    a = build_encoder(spec, TASK, 3, public=pool, store=store)
    assert (store.misses, store.hits) == (1, 0) and a.info["pretrain_cache_hit"] is False
    b = build_encoder(spec, TASK, 3, public=pool, store=ArtefactStore(tmp_path / "cache"))
    assert b.info["pretrain_cache_hit"] is True and b.fingerprint == a.fingerprint
    same = PretrainConfig(dim=8, width=4, epochs=2, batch_size=16, seed=3)
    reference, _ = pretrain_encoder(pool, TASK, same, torch.device("cpu"))
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(b.embed(x, torch.device("cpu")), reference(x))
    assert build_encoder(spec, TASK, 4, public=pool).fingerprint != a.fingerprint  # model seed
    with pytest.raises(EncoderError, match="expected public_size >= 2, got 0"):
        build_encoder(spec, TASK, 3)
    with pytest.raises(EncoderError, match="multiple of 4"):
        build_encoder("simclr:dim=6", TASK, 3, public=pool)


def _raw_meta(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def test_encoder_cli_pretrain_then_probe(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    out = tmp_path / "enc.safetensors"
    args = ["dataset=digits", "public_size=200", f"cache_dir={tmp_path / 'cache'}"]
    done = CliRunner().invoke(
        app, ["encoder", "pretrain", "--out", str(out), "--epochs", "1", "--dim", "8", *args]
    )
    assert done.exit_code == 0, done.output
    assert "encoder=file:path=" in done.output and out.is_file()
    probe = tmp_path / "probe.json"
    done = CliRunner().invoke(
        app,
        [
            "encoder",
            "probe",
            "--encoder",
            f"file:path={out}",
            "--epochs",
            "2",
            "--out",
            str(probe),
            *args,
        ],
    )
    assert done.exit_code == 0, done.output
    import json

    assert 0.0 <= json.loads(probe.read_text())["linear_probe_accuracy"] <= 1.0
    bad = CliRunner().invoke(app, ["encoder", "pretrain", "--out", str(out), "dataset=digits"])
    assert bad.exit_code == 2 and "public_size > 0" in bad.output


def test_torchvision_features_can_be_randomly_projected(resnet18_weights: Path) -> None:
    base = f"torchvision:arch=resnet18:weights={resnet18_weights}:size=32"
    plain = build_encoder(base, TASK, 0)
    projected = build_encoder(f"{base}:project=16", TASK, 0)
    x = torch.randn(3, 1, 8, 8)
    z = projected.embed(x, torch.device("cpu"))
    assert projected.dim == 16 and z.shape == (3, 16)
    linear = projected.module[-1]
    want = plain.embed(x, torch.device("cpu")) @ linear.weight.T + linear.bias
    torch.testing.assert_close(z, want, rtol=1e-4, atol=1e-5)
    assert not any(p.requires_grad for p in projected.module.parameters())  # never trained
    again = build_encoder(f"{base}:project=16", TASK, 0)
    other_seed = build_encoder(f"{base}:project=16", TASK, 1)
    assert again.fingerprint == projected.fingerprint != other_seed.fingerprint
    with pytest.raises(EncoderError, match="project >= 1"):
        build_encoder(f"{base}:project=0", TASK, 0)
