"""The shared autoencoder (oneshotfl.encoders.autoencoder): its sources, its file and its
checks, and that pretraining learns to reconstruct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.autoencoder import (
    AUTOENCODERS,
    AutoencoderConfig,
    ConvAutoencoder,
    auto_downsample,
    build_autoencoder,
    pretrain_autoencoder,
    save_autoencoder,
    spec_latent_shape,
)
from oneshotfl.encoders.base import EncoderError
from oneshotfl.training.artefacts import ArtefactStore

TASK = TaskInfo("digits", 10, 1, 8)
SPEC = "public:channels=2:width=8:epochs=3:min_steps=0:batch_size=32"


def bars(n: int, side: int = 8, seed: int = 0) -> torch.Tensor:
    """Normalised images of one bright row or column each: structure an autoencoder can learn."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.zeros(n, 1, side, side)
    where = torch.randint(0, side, (n,), generator=gen)
    rows = torch.rand(n, generator=gen) < 0.5
    for i in range(n):
        if rows[i]:
            pixels[i, 0, where[i], :] = 1.0
        else:
            pixels[i, 0, :, where[i]] = 1.0
    model = ConvAutoencoder(TASK, AutoencoderConfig())
    return model.from_pixels(pixels)


def test_shapes_round_trip_and_output_range() -> None:
    for side, down, latent in ((8, 4, 2), (28, 4, 7), (28, 2, 14), (32, 8, 4)):
        task = TaskInfo("fashion_mnist", 10, 1, side)
        model = ConvAutoencoder(task, AutoencoderConfig(channels=3, downsample=down, width=4))
        x = torch.randn(5, 1, side, side)
        z = model.encode(x)
        assert z.shape == (5, 3, latent, latent)
        out = model.decode(z)
        assert out.shape == x.shape
        pixels = out * model.std + model.mean  # decoded pixels lie in (0, 1)
        pixels = pixels.detach()
        assert float(pixels.min()) >= 0.0 and float(pixels.max()) <= 1.0


def test_auto_downsample_leaves_a_latent_side_of_four_or_more() -> None:
    assert [auto_downsample(s) for s in (8, 28, 32, 64, 6, 7, 1)] == [2, 4, 8, 8, 1, 1, 1]


def test_pretraining_learns_to_reconstruct() -> None:
    pool, held_out = bars(512), bars(64, seed=1)
    cfg = AutoencoderConfig(channels=2, width=16, epochs=30, min_steps=0, batch_size=64, lr=3e-3)
    untrained = ConvAutoencoder(TASK, cfg)
    trained, losses = pretrain_autoencoder(pool, TASK, cfg, torch.device("cpu"))
    assert losses[-1] < 0.5 * losses[0]
    assert not any(p.requires_grad for p in trained.parameters()) and not trained.training

    def error(model: ConvAutoencoder) -> float:
        with torch.no_grad():
            recon = model.to_pixels(model.decode(model.encode(held_out)))
        return float((recon - model.to_pixels(held_out)).square().mean())

    assert error(trained) < 0.5 * error(untrained)


def test_public_source_is_cached_seeded_and_checked(tmp_path: Path) -> None:
    pool = bars(64)
    store = ArtefactStore(tmp_path / "cache")
    a = build_autoencoder(SPEC, TASK, 3, public=pool, store=store)
    assert a.info["cache_hit"] is False and (store.misses, store.hits) == (1, 0)
    b = build_autoencoder(SPEC, TASK, 3, public=pool, store=ArtefactStore(tmp_path / "cache"))
    assert b.info["cache_hit"] is True and b.fingerprint == a.fingerprint
    x = pool[:4]
    with torch.no_grad():
        assert torch.equal(a.model.encode(x), b.model.encode(x))
    assert build_autoencoder(SPEC, TASK, 4, public=pool).fingerprint != a.fingerprint
    # a public artefact: a party's scoped view finds the one another party computed on disk
    run = ArtefactStore(tmp_path / "run")
    first = build_autoencoder(SPEC, TASK, 5, public=pool, store=run.scoped("client 0"))
    second = build_autoencoder(SPEC, TASK, 5, public=pool, store=run.scoped("server"))
    assert (first.info["cache_hit"], second.info["cache_hit"]) == (False, True)
    assert second.fingerprint == first.fingerprint and (run.misses, run.hits) == (1, 1)
    # without a disk cache the parties of one process still share the one pretraining
    memory = ArtefactStore(None)
    for party in ("client 0", "client 1", "server"):
        build_autoencoder(SPEC, TASK, 5, public=pool, store=memory.scoped(party))
    assert (memory.misses, memory.hits) == (1, 2)
    assert a.latent_shape(8) == (2, 2, 2) == spec_latent_shape(SPEC, 8)
    assert spec_latent_shape("public", 28) == (4, 7, 7)
    with pytest.raises(EncoderError, match="expected public_size >= 1, got 0"):
        build_autoencoder(SPEC, TASK, 3)
    with pytest.raises(EncoderError, match="unknown option"):
        build_autoencoder("public:depth=3", TASK, 3, public=pool)
    with pytest.raises(EncoderError, match="downsample: expected 1, 2, 4, 8 or 16, got 3"):
        build_autoencoder("public:downsample=3", TASK, 3, public=pool)
    with pytest.raises(EncoderError, match="multiple of downsample=16, got 8"):
        build_autoencoder("public:downsample=16", TASK, 3, public=pool)
    with pytest.raises(EncoderError, match="unknown autoencoder 'vae'; expected one of"):
        build_autoencoder("vae", TASK, 3, public=pool)
    assert {"public", "file"} <= set(AUTOENCODERS.names())


def test_file_source_round_trips_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    made = build_autoencoder(SPEC, TASK, 0, public=bars(64))
    path = tmp_path / "ae.safetensors"
    digest = save_autoencoder(made, path, {"dataset": "digits"})
    assert digest == made.fingerprint
    loaded = build_autoencoder(f"file:path={path}:sha256={digest}", TASK, 9)
    assert loaded.fingerprint == made.fingerprint and loaded.config.channels == 2
    assert spec_latent_shape(f"file:path={path}", 8) == (2, 2, 2)
    with pytest.raises(EncoderError, match="cannot read"):
        spec_latent_shape(f"file:path={tmp_path / 'none'}", 8)
    x = bars(4)
    with torch.no_grad():
        assert torch.equal(
            loaded.model.decode(loaded.model.encode(x)), made.model.decode(made.model.encode(x))
        )
    with pytest.raises(EncoderError, match="does not match the requested hash"):
        build_autoencoder(f"file:path={path}:sha256={'0' * 64}", TASK, 0)
    with pytest.raises(EncoderError, match="built for 1 input channels, the task has 3"):
        build_autoencoder(f"file:path={path}", TaskInfo("cifar10", 10, 3, 8), 0)
    with pytest.raises(EncoderError, match="multiple of downsample=4, got 6"):
        build_autoencoder(f"file:path={path}", TaskInfo("digits", 10, 1, 6), 0)
    with pytest.raises(EncoderError, match="no autoencoder file at"):
        build_autoencoder(f"file:path={tmp_path / 'none'}", TASK, 0)
    with pytest.raises(EncoderError, match="expected path=FILE"):
        build_autoencoder("file", TASK, 0)
    from oneshotfl.encoders.pretrain import save_encoder

    encoder_file = tmp_path / "encoder.safetensors"
    save_encoder(torch.nn.Linear(2, 2), encoder_file, {"arch": "conv"})
    with pytest.raises(EncoderError, match="expected arch 'conv-kl-autoencoder', got 'conv'"):
        build_autoencoder(f"file:path={encoder_file}", TASK, 0)
    (tmp_path / "junk").write_bytes(b"not a file of weights")
    with pytest.raises(EncoderError, match="is not an autoencoder file"):
        build_autoencoder(f"file:path={tmp_path / 'junk'}", TASK, 0)


def test_encoder_cli_autoencoder_writes_a_file_the_file_source_loads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    out = tmp_path / "ae.safetensors"
    args = ["dataset=digits", "public_size=100", f"cache_dir={tmp_path / 'cache'}"]
    flags = ["--epochs", "1", "--min-steps", "0", "--width", "4", "--channels", "2"]
    flags += ["--out", str(out)]
    done = CliRunner().invoke(app, ["encoder", "autoencoder", *flags, *args])
    assert done.exit_code == 0, done.output
    from oneshotfl.encoders.pretrain import read_metadata

    meta = read_metadata(out)
    spec = f"file:path={out}:sha256={meta['content_hash']}"
    assert f"useitwith:autoencoder={spec}" in "".join(done.output.split())  # wrapped or not
    loaded = build_autoencoder(spec, TASK, 0)
    assert meta["public_size"] == 100 and meta["dataset"] == "digits" and meta["channels"] == 2
    assert loaded.config.width == 4 and json.dumps(meta)
    bad = CliRunner().invoke(app, ["encoder", "autoencoder", "--out", str(out), "dataset=digits",
                                   "public_size=0"])  # fmt: skip
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "expected public_size > 0" in bad.output
