"""``oneshotfl encoder ...``: research commands on shared frozen encoders — pretrain one with
SimCLR on the public pool (or FedSD2C's autoencoder), linear-probe it, price its client cost in
FLOPs, and audit it with a model-inversion attack. Registered by :mod:`oneshotfl.cli.main` as
the ``encoder`` group."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer
from rich.table import Table

from oneshotfl.cli.support import USER_ERRORS, console, err_console, fail, setup_logging
from oneshotfl.encoders.base import Encoder
from oneshotfl.registry import RegistryError
from oneshotfl.runner.config import ConfigError, ExperimentConfig, load_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.files import atomic_write_text
from oneshotfl.runner.plan import federation_plan
from oneshotfl.training.progress import RichTracker

app = typer.Typer(help="Shared frozen encoders: pretrain, probe, price and audit one.")


def _encoder_setup(
    config: Path | None, overrides: list[str] | None, encoder: str
) -> tuple[ExperimentConfig, Federation, Encoder]:
    """Load the experiment with the shared ``encoder`` (built, and pretrained if it is
    ``simclr``); a bad config or encoder exits with one clear error."""
    try:
        cfg = load_config(config, overrides or [], {"encoder": encoder})
        exp = Federation.prepare(federation_plan(cfg))
    except (*USER_ERRORS, ValueError) as exc:
        fail(exc)
    assert exp.encoder is not None  # prepare builds it when cfg.encoder is set
    return cfg, exp, exp.encoder


@app.command("pretrain")
def encoder_pretrain(
    out: Annotated[Path, typer.Option(help="the safetensors file to write")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value experiment overrides (data, pool)")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config")] = None,
    epochs: Annotated[int, typer.Option(help="SimCLR epochs over the public pool")] = 20,
    dim: Annotated[int, typer.Option(help="embedding size (multiple of 4)")] = 64,
    width: Annotated[int, typer.Option(help="first conv layer's channels")] = 32,
    batch_size: Annotated[int, typer.Option(help="images per batch")] = 256,
    temperature: Annotated[float, typer.Option(help="NT-Xent temperature")] = 0.5,
) -> None:
    """Train the conv encoder with SimCLR on the experiment's public pool only (no labels)."""
    from oneshotfl.encoders.pretrain import PretrainConfig, pretrain_encoder, save_encoder
    from oneshotfl.fingerprints import tensor_fingerprint

    setup_logging(False)
    try:
        cfg = load_config(config, overrides or [], {})
        if cfg.public_size < 1:
            raise ConfigError("encoder pretrain: expected public_size > 0 (it trains on the pool)")
        pre = PretrainConfig(dim, width, epochs, batch_size, temperature=temperature, seed=cfg.seed)
        exp = Federation.prepare(federation_plan(dataclasses.replace(cfg, encoder=None)))
    except (*USER_ERRORS, ValueError) as exc:
        fail(exc)
    public = exp.data.public
    assert public is not None
    start = time.perf_counter()
    with RichTracker(err_console) as tracker:
        task = exp.data.task
        module, losses = pretrain_encoder(public.x, task, pre, exp.device, tracker)
    metadata = {
        "arch": "conv",
        "objective": "simclr",
        **dataclasses.asdict(pre),
        "in_channels": exp.data.task.in_channels,
        "dataset": cfg.dataset,
        "public_size": len(public),
        "public_fingerprint": tensor_fingerprint(public.x),
        "losses": [round(v, 5) for v in losses],
        "seconds": round(time.perf_counter() - start, 1),
    }
    digest = save_encoder(module, out, metadata)
    console.print(f"encoder: {out}  (SimCLR loss {losses[0]:.3f} → {losses[-1]:.3f})")
    console.print(f"use it with: encoder=file:path={out}:sha256={digest}", markup=False)


@app.command("autoencoder")
def encoder_autoencoder(
    out: Annotated[Path, typer.Option(help="the safetensors file to write")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value experiment overrides (data, pool)")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config")] = None,
    channels: Annotated[int, typer.Option(help="latent maps")] = 4,
    downsample: Annotated[int, typer.Option(help="image side / latent side (a power of 2)")] = 4,
    width: Annotated[int, typer.Option(help="hidden conv channels")] = 32,
    epochs: Annotated[int, typer.Option(help="passes over the public pool, at least")] = 5,
    min_steps: Annotated[int, typer.Option(help="optimiser steps, at least")] = 500,
    batch_size: Annotated[int, typer.Option(help="images per batch")] = 64,
    kl: Annotated[float, typer.Option(help="weight of the KL term")] = 1e-6,
) -> None:
    """Train the shared KL autoencoder (FedSD2C's) on the experiment's public pool only (no
    labels) and save it for ``autoencoder=file:path=…:sha256=…``."""
    from oneshotfl.encoders.autoencoder import (
        AutoencoderConfig,
        build_autoencoder,
        save_autoencoder,
    )

    setup_logging(False)
    try:
        cfg = load_config(config, overrides or [], {})
        if cfg.public_size < 1:
            raise ConfigError(
                "encoder autoencoder: expected public_size > 0 (it trains on the pool)"
            )
        shape = AutoencoderConfig(
            channels=channels, downsample=downsample, width=width, epochs=epochs,
            min_steps=min_steps, batch_size=batch_size, kl=kl,
        )  # fmt: skip
        exp = Federation.prepare(federation_plan(dataclasses.replace(cfg, encoder=None)))
        public = exp.data.public
        assert public is not None
        options = ":".join(f"{k}={v}" for k, v in dataclasses.asdict(shape).items() if k != "seed")
        start = time.perf_counter()
        auto = build_autoencoder(f"public:{options}", exp.data.task, cfg.seed, public=public.x,
                                 device=exp.device)  # fmt: skip
    except (*USER_ERRORS, ValueError) as exc:
        fail(exc)
    metadata = {
        **auto.info,
        "dataset": cfg.dataset,
        "public_size": len(public),
        "seconds": round(time.perf_counter() - start, 1),
    }
    digest = save_autoencoder(auto, out, metadata)
    console.print(
        f"autoencoder: {out}  (loss {auto.info['pretrain_losses_first_last']})", markup=False
    )
    console.print(f"use it with: autoencoder=file:path={out}:sha256={digest}", markup=False)


@app.command("probe")
def encoder_probe(
    encoder: Annotated[str, typer.Option(help="encoder spec, e.g. random or file:path=…")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config")] = None,
    epochs: Annotated[int, typer.Option(help="linear probe epochs")] = 30,
    out: Annotated[Path | None, typer.Option(help="write the result as JSON here")] = None,
) -> None:
    """Linear-probe accuracy: a linear layer on the frozen embeddings of the clients' data
    (labels used here only to measure the encoder), tested on the test split."""
    from oneshotfl.data.types import LabelledData
    from oneshotfl.seeding import torch_generator
    from oneshotfl.training.loop import TrainConfig, accuracy, train_classifier

    setup_logging(False)
    cfg, exp, enc = _encoder_setup(config, overrides, encoder)
    fed = exp.data
    x = torch.cat([c.train.x for c in fed.clients])
    y = torch.cat([c.train.y for c in fed.clients])
    z, z_test = enc.embed(x, exp.device), enc.embed(fed.test.x, exp.device)
    mean, std = z.mean(0), z.std(0).clamp_min(1e-6)  # standardise: a linear probe's usual step
    probe = torch.nn.Linear(enc.dim, fed.task.num_classes)
    train_classifier(
        probe,
        LabelledData((z - mean) / std, y),
        TrainConfig(epochs, 256, 1e-2, "adam"),
        torch_generator(cfg.seed, "probe"),
        exp.device,
    )
    acc = accuracy(probe((z_test - mean) / std), fed.test.y)
    result = {
        "encoder": enc.spec,
        "fingerprint": enc.fingerprint,
        "dim": enc.dim,
        "train_examples": len(z),
        "epochs": epochs,
        "linear_probe_accuracy": acc,
    }
    if out is not None:
        atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    console.print(f"linear probe accuracy of {enc.spec}: {100 * acc:.2f}%", markup=False)


@app.command("attack")
def encoder_attack(
    encoder: Annotated[str, typer.Option(help="encoder spec to audit (identity = control)")],
    out: Annotated[Path, typer.Option(help="directory for metrics.json and grid.png")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config")] = None,
    epsilons: Annotated[str, typer.Option(help="ε values; 'none' = clean latents")] = "none,8,2",
    delta: Annotated[float, typer.Option(help="δ of the local DP")] = 1e-5,
    clip: Annotated[float, typer.Option(help="L2 clip bound C of the latents")] = 1.0,
    samples: Annotated[int, typer.Option(help="test images attacked")] = 8,
    steps: Annotated[int, typer.Option(help="optimisation steps")] = 300,
    lam: Annotated[float, typer.Option(help="λ of the total-variation prior")] = 1e-4,
) -> None:
    """Model-inversion audit (FedAGE Eq. 8): reconstruct images from their (noised) latents;
    writes PSNR/SSIM against ε and a grid of originals vs reconstructions."""
    from oneshotfl.plots import image_grid
    from oneshotfl.privacy import gaussian_release
    from oneshotfl.security.inversion import invert, psnr, ssim, to_unit_range
    from oneshotfl.seeding import torch_generator

    setup_logging(False)
    try:
        levels = [None if e.strip() == "none" else float(e) for e in epsilons.split(",")]
    except ValueError:
        fail(ConfigError(f"--epsilons: expected numbers or 'none', got {epsilons!r}"))
    cfg, exp, enc = _encoder_setup(config, overrides, encoder)
    fed = exp.data
    x = fed.test.x[:samples]
    z = enc.embed(x, torch.device("cpu"))
    originals = to_unit_range(x, fed.task.dataset)
    rows: dict[str, np.ndarray] = {"original": originals.numpy()}
    metrics = []
    for eps in levels:
        target = z
        if eps is not None:
            target, _ = gaussian_release(z, clip, eps, delta, torch_generator(cfg.seed, "attack"))
        shape = (int(x.shape[1]), int(x.shape[2]), int(x.shape[3]))
        recon = to_unit_range(invert(enc, target, shape, steps, lam=lam), fed.task.dataset)
        label = "clean" if eps is None else f"ε={eps:g}"
        rows[label] = recon.numpy()
        metrics.append(
            {
                "epsilon": eps,
                "psnr_db": float(psnr(recon, originals).mean()),
                "ssim": float(ssim(recon, originals).mean()),
            }
        )
        last = metrics[-1]
        console.print(f"{label}: PSNR {last['psnr_db']:.2f} dB, SSIM {last['ssim']:.3f}")
    doc = {
        "encoder": enc.spec,
        "fingerprint": enc.fingerprint,
        "delta": delta,
        "clip": clip,
        "samples": len(x),
        "steps": steps,
        "lambda_tv": lam,
        "results": metrics,
    }
    atomic_write_text(out / "metrics.json", json.dumps(doc, indent=2) + "\n")
    image_grid(rows, out / "grid.png", f"inversion of {enc.spec}")
    console.print(f"attack: {out}", markup=False)


@app.command("cost")
def encoder_cost(
    encoder: Annotated[str, typer.Option(help="the shared encoder spec, e.g. random")],
    out: Annotated[Path, typer.Option(help="directory for cost.json and cost.png")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config")] = None,
    head: Annotated[str, typer.Option(help="FedAGE's client head architecture")] = "head_mlp",
    full: Annotated[
        list[str] | None, typer.Option(help="client model trained end to end (repeatable)")
    ] = None,
    head_epochs: Annotated[int, typer.Option(help="FedAGE head epochs")] = 7,
    full_epochs: Annotated[int | None, typer.Option(help="full-model epochs")] = None,
    backbone: Annotated[
        list[str] | None,
        typer.Option(help="also price a torchvision backbone, NAME@SIZE (repeatable)"),
    ] = None,
    samples: Annotated[int, typer.Option(help="images in the measured batch")] = 32,
) -> None:
    """Client cost, measured with FlopCounterMode: FedAGE (encoder once + head epochs) vs
    training full client models, in GFLOPs per sample (FLOPs, not MACs)."""
    from oneshotfl.encoders.cost import backbone_forward_flops, client_cost
    from oneshotfl.plots import line_plot

    setup_logging(False)
    try:  # cheap checks first: the encoder may take minutes to pretrain
        if samples < 1 or head_epochs < 1 or (full_epochs is not None and full_epochs < 1):
            raise ConfigError("samples, head-epochs and full-epochs: expected >= 1")
        priced = [(b.partition("@")[0], int(b.partition("@")[2] or 224)) for b in backbone or []]
    except ValueError as exc:
        fail(exc)
    cfg, exp, enc = _encoder_setup(config, overrides, encoder)
    fed = exp.data
    x = fed.test.x[:samples]
    epochs = cfg.local_epochs if full_epochs is None else full_epochs
    try:
        doc = client_cost(enc, head, full or [cfg.model], x, head_epochs, epochs)
        doc["backbones"] = {
            f"{arch}@{size}": {
                "forward_flops_per_sample": backbone_forward_flops(arch, size, fed.task, x)
            }
            for arch, size in priced
        }
    except (RegistryError, ValueError) as exc:
        fail(exc)
    atomic_write_text(out / "cost.json", json.dumps(doc, indent=2) + "\n")
    series = {
        f"full {arch}": [(c["epoch"], c["full_gflops"], 0.0) for c in curve]
        for arch, curve in doc["curves"].items()
    }
    first = next(iter(doc["curves"].values()))
    series["FedAGE (encoder once + head)"] = [(c["epoch"], c["fedage_gflops"], 0.0) for c in first]
    line_plot(series, out / "cost.png", "epoch", "cumulative GFLOPs per sample", "client cost")
    table = Table("client work", "GFLOPs / sample", "trainable parameters")
    table.add_row(
        f"FedAGE: {enc.spec} once + {head_epochs} epochs of {head}",
        f"{doc['fedage']['total_gflops_per_sample']:.6f}",
        str(doc["head"]["trainable_parameters"]),
    )
    for arch, row in doc["full"]["models"].items():
        table.add_row(
            f"{epochs} epochs of {arch}",
            f"{row['total_gflops_per_sample']:.6f}",
            str(row["trainable_parameters"]),
        )
    for name, row in doc["backbones"].items():
        table.add_row(f"{name} forward (once)", f"{row['forward_flops_per_sample'] / 1e9:.4f}", "0")
    console.print(table)
    console.print(f"cost: {out}", markup=False)
