"""The ``oneshotfl`` command: run, sweep, report, partition, list."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from oneshotfl.data.datasets import (
    DATASETS,
    DatasetFormatError,
    DatasetNotFoundError,
    load_dataset,
)
from oneshotfl.data.partition import PARTITIONERS, PartitionError
from oneshotfl.encoders import Encoder
from oneshotfl.methods import METHODS
from oneshotfl.models import MODELS
from oneshotfl.plots import partition_heatmap
from oneshotfl.registry import Registry, RegistryError
from oneshotfl.runner.config import ConfigError, ExperimentConfig, load_config, make_config
from oneshotfl.runner.federation import build_federation
from oneshotfl.runner.report import human_bytes, setting_label, splice_markdown, write_report
from oneshotfl.runner.results import atomic_write_text, write_result
from oneshotfl.runner.simulation import QuorumError, Setup, prepare, run_experiment
from oneshotfl.runner.sweep import load_sweep, select_seeds, select_shard
from oneshotfl.training.progress import RichTracker

app = typer.Typer(
    help="One-shot federated learning: run methods, sweeps and reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; give them room.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
log = logging.getLogger("oneshotfl")

USER_ERRORS = (
    ConfigError,
    RegistryError,
    DatasetNotFoundError,
    DatasetFormatError,
    PartitionError,
    QuorumError,
    FileNotFoundError,
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, show_time=False)],
        force=True,
    )


def _fail(exc: BaseException) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
    raise typer.Exit(2)


def _given(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value config overrides")
    ] = None,
    method: Annotated[str | None, typer.Option(help="comma-separated method specs")] = None,
    dataset: Annotated[str | None, typer.Option(help="dataset name")] = None,
    data_root: Annotated[str | None, typer.Option(help="dataset directory")] = None,
    download: Annotated[
        bool | None, typer.Option("--download", help="download via torchvision")
    ] = None,
    partition: Annotated[str | None, typer.Option(help="partitioner name")] = None,
    alpha: Annotated[float | None, typer.Option(help="Dirichlet concentration")] = None,
    classes_per_client: Annotated[int | None, typer.Option(help="#C for pathological")] = None,
    clients: Annotated[int | None, typer.Option(help="number of clients")] = None,
    model: Annotated[str | None, typer.Option(help="client architectures")] = None,
    server_model: Annotated[str | None, typer.Option(help="server architecture")] = None,
    local_epochs: Annotated[int | None, typer.Option(help="client epochs")] = None,
    public_size: Annotated[int | None, typer.Option(help="public pool size (0 = none)")] = None,
    max_train: Annotated[int | None, typer.Option(help="subsample the training split")] = None,
    seed: Annotated[int | None, typer.Option(help="model/training seed")] = None,
    partition_seed: Annotated[int | None, typer.Option(help="data-split seed")] = None,
    device: Annotated[str | None, typer.Option(help="auto|cpu|cuda")] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="do not use the artefact cache")
    ] = False,
    out: Annotated[Path | None, typer.Option(help="results directory")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run methods on one federation and write result.json, CSVs and a partition heatmap."""
    _setup_logging(verbose)
    cli = _given(
        methods=method,
        dataset=dataset,
        data_root=data_root,
        download=download,
        partition=partition,
        alpha=alpha,
        classes_per_client=classes_per_client,
        clients=clients,
        model=model,
        server_model=server_model,
        local_epochs=local_epochs,
        public_size=public_size,
        max_train=max_train,
        seed=seed,
        partition_seed=partition_seed,
        device=device,
    )
    if no_cache:
        cli["cache_dir"] = None
    try:
        cfg = load_config(config, overrides or [], cli)
        out_dir = out or Path("runs") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        if (out_dir / "result.json").exists():
            raise ConfigError(f"{out_dir}/result.json exists; choose another --out")
        with RichTracker(err_console) as tracker:
            doc = run_experiment(cfg, tracker)
    except USER_ERRORS as exc:
        _fail(exc)
    path = write_result(out_dir, doc)
    _write_heatmap(doc, out_dir / "partition.png")
    console.print(results_table(doc))
    console.print(
        f"results: {path}  (cache: {doc['cache']['hits']} hits, "
        f"{doc['cache']['misses']} misses; {doc['wall_time_s']:.1f} s)"
    )


def _write_heatmap(doc: dict[str, Any], path: Path) -> None:
    counts = np.array([c["label_histogram"] for c in doc["clients"]])
    c = doc["config"]
    partition_heatmap(counts, path, f"{c['dataset']} · {c['partition']} · {c['clients']} clients")


def results_table(doc: dict[str, Any]) -> Table:
    """The per-method summary as a rich table."""
    c = doc["config"]
    title = f"{c['dataset']} · {setting_label(c)} · {c['clients']} clients · seed {c['seed']}"
    table = Table(title=title)
    for name in (
        "method",
        "accuracy",
        "best/worst",
        "personal",
        "upload/client",
        "client s",
        "server s",
    ):
        table.add_column(name, justify="left" if name == "method" else "right")
    for r in doc["methods"]:
        extremes = (
            f"{100 * r['accuracy_best']:.2f}/{100 * r['accuracy_worst']:.2f}"
            if "accuracy_best" in r
            else ""
        )
        table.add_row(
            r["key"],
            f"{100 * r['accuracy']:.2f}%",
            extremes,
            f"{100 * r['personal_accuracy']:.2f}%",
            human_bytes(r["upload_bytes_mean"]),
            f"{r['client_wall_s_mean']:.2f}",
            f"{r['server_wall_s']:.2f}",
        )
    return table


@app.command()
def partition(
    dataset: Annotated[str, typer.Option(help="dataset name")] = "fashion_mnist",
    data_root: Annotated[str | None, typer.Option(help="dataset directory")] = None,
    partition: Annotated[str, typer.Option("--partition", "-p", help="partitioner")] = "dirichlet",
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration")] = 0.5,
    classes_per_client: Annotated[int, typer.Option(help="#C for pathological")] = 2,
    clients: Annotated[int, typer.Option(help="number of clients")] = 10,
    public_size: Annotated[int, typer.Option(help="public pool size")] = 0,
    max_train: Annotated[int | None, typer.Option(help="subsample the training split")] = None,
    seed: Annotated[int, typer.Option(help="partition seed")] = 0,
    png: Annotated[Path | None, typer.Option(help="save a heatmap PNG here")] = None,
) -> None:
    """Print the client × class count matrix of a partition (and save a heatmap)."""
    _setup_logging(False)
    try:
        cfg = make_config(
            dict(
                dataset=dataset,
                data_root=data_root,
                partition=partition,
                alpha=alpha,
                classes_per_client=classes_per_client,
                clients=clients,
                public_size=public_size,
                max_train=max_train,
                seed=seed,
            )
        )
        fed = build_federation(load_dataset(cfg.dataset, cfg.data_root), cfg)
    except USER_ERRORS as exc:
        _fail(exc)
    counts = fed.label_histograms()
    table = Table(title=f"{dataset} · {partition} · {clients} clients · seed {seed}")
    table.add_column("client", justify="right")
    for k in range(counts.shape[1]):
        table.add_column(str(k), justify="right")
    table.add_column("total", justify="right")
    for cid, row in enumerate(counts):
        table.add_row(str(cid), *(str(v) for v in row), str(row.sum()))
    console.print(table)
    if png is not None:
        partition_heatmap(counts, png, f"{dataset} · {partition} · {clients} clients")
        console.print(f"heatmap: {png}")


REGISTRIES: dict[str, Registry[Any]] = {
    "methods": METHODS,
    "models": MODELS,
    "datasets": DATASETS,
    "partitioners": PARTITIONERS,
}


@app.command("list")
def list_(
    what: Annotated[str, typer.Argument(help="methods|models|datasets|partitioners")],
) -> None:
    """Print a registry: one name per line, then its description."""
    registry = REGISTRIES.get(what)
    if registry is None:
        _fail(ValueError(f"expected one of {', '.join(REGISTRIES)}, got {what!r}"))
        return
    width = max(len(n) for n in registry.names())
    for entry in registry.entries():
        typer.echo(f"{entry.name:<{width}}  {entry.description}")


@app.command()
def describe(method: Annotated[str, typer.Argument(help="a registered method name")]) -> None:
    """Print a method's paper, deviations and choices, requirements and hyper-parameters."""
    try:
        cls = METHODS.get(method)
    except RegistryError as exc:
        _fail(exc)
        return
    module = inspect.getmodule(cls)
    typer.echo(inspect.cleandoc(module.__doc__ or "") if module else "")
    typer.echo(f"\nrequires: {cls.requires}")
    typer.echo("hyper-parameters (set as --method NAME:key=value):")
    for f in dataclasses.fields(cls.Config):
        default = f.default if f.default is not dataclasses.MISSING else "(required)"
        typer.echo(f"  {f.name} = {default!r}")


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="sweep YAML")],
    out: Annotated[Path | None, typer.Option(help="results root (default runs/NAME)")] = None,
    force: Annotated[bool, typer.Option("--force", help="rerun finished runs")] = False,
    seeds: Annotated[
        str | None,
        typer.Option(help="run only these seeds, e.g. 0,1 (shards a sweep across processes)"),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(help="run only shard K/N of the grid points (parallel processes)"),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run every point of a sweep grid; finished runs are skipped (resume)."""
    _setup_logging(verbose)
    try:
        spec = load_sweep(file)
        runs = select_shard(select_seeds(spec.runs, seeds), shard)
    except USER_ERRORS as exc:
        _fail(exc)
    root = out or Path("runs") / spec.name
    start = time.perf_counter()
    done = 0
    for i, point in enumerate(runs, 1):
        run_dir = root / point.run_id
        if (run_dir / "result.json").exists() and not force:
            log.info("[%d/%d] %s: done already, skipped", i, len(runs), point.run_id)
            continue
        log.info("[%d/%d] %s", i, len(runs), point.run_id)
        try:
            with RichTracker(err_console) as tracker:
                doc = run_experiment(point.config, tracker)
        except USER_ERRORS as exc:
            _fail(exc)
        write_result(run_dir, doc)
        done += 1
        console.print(results_table(doc))
    elapsed = time.perf_counter() - start
    meta = {
        "name": spec.name,
        "runs": len(runs),
        "ran_now": done,
        "wall_time_s_this_invocation": elapsed,
        "argv": sys.argv[1:],
    }
    parts = [f"seeds-{seeds.replace(',', '-')}" if seeds else "", f"shard-{shard}" if shard else ""]
    suffix = "_".join(p.replace("/", "of") for p in parts if p)
    name = f"sweep-{suffix}.json" if suffix else "sweep.json"
    atomic_write_text(root / name, json.dumps(meta, indent=2) + "\n")
    console.print(f"sweep {spec.name}: {done} run(s) in {elapsed / 60:.1f} min → {root}")


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="directory holding result.json files")],
    out: Annotated[
        Path | None, typer.Option(help="report directory (default RESULTS/report)")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="splice the table into this markdown")
    ] = None,
    section: Annotated[str, typer.Option(help="marker name in the markdown file")] = "",
) -> None:
    """Mean ± std over seeds as a markdown table, CSV summary and PNG plots."""
    _setup_logging(False)
    out_dir = out or results / "report"
    try:
        _, text = write_report(
            results, out_dir, str(results.name), link_from=markdown.parent if markdown else None
        )
        if markdown is not None:
            splice_markdown(markdown, section or results.name, text)
    except (*USER_ERRORS, ValueError) as exc:
        _fail(exc)
    console.print(text, markup=False)
    console.print(f"report: {out_dir}", markup=False)


encoder_app = typer.Typer(help="Shared frozen encoders: pretrain one, probe one.")
app.add_typer(encoder_app, name="encoder")


def _encoder_setup(
    config: Path | None, overrides: list[str] | None, encoder: str
) -> tuple[ExperimentConfig, Setup, Encoder]:
    """Load the experiment with the shared ``encoder`` (built, and pretrained if it is
    ``simclr``); a bad config or encoder exits with one clear error."""
    try:
        cfg = load_config(config, overrides or [], {"encoder": encoder})
        setup = prepare(cfg)
    except (*USER_ERRORS, ValueError) as exc:
        _fail(exc)
    assert setup.encoder is not None  # prepare builds it when cfg.encoder is set
    return cfg, setup, setup.encoder


@encoder_app.command("pretrain")
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
    from oneshotfl.federation.artefacts import tensor_fingerprint

    _setup_logging(False)
    try:
        cfg = load_config(config, overrides or [], {})
        if cfg.public_size < 1:
            raise ConfigError("encoder pretrain: expected public_size > 0 (it trains on the pool)")
        pre = PretrainConfig(dim, width, epochs, batch_size, temperature=temperature, seed=cfg.seed)
        setup = prepare(dataclasses.replace(cfg, encoder=None))
    except (*USER_ERRORS, ValueError) as exc:
        _fail(exc)
    public = setup.federation.public
    assert public is not None
    start = time.perf_counter()
    with RichTracker(err_console) as tracker:
        task = setup.federation.task
        module, losses = pretrain_encoder(public.x, task, pre, setup.device, tracker)
    metadata = {
        "arch": "conv",
        "objective": "simclr",
        **dataclasses.asdict(pre),
        "in_channels": setup.federation.task.in_channels,
        "dataset": cfg.dataset,
        "public_size": len(public),
        "public_fingerprint": tensor_fingerprint(public.x),
        "losses": [round(v, 5) for v in losses],
        "seconds": round(time.perf_counter() - start, 1),
    }
    digest = save_encoder(module, out, metadata)
    console.print(f"encoder: {out}  (SimCLR loss {losses[0]:.3f} → {losses[-1]:.3f})")
    console.print(f"use it with: encoder=file:path={out}:sha256={digest}", markup=False)


@encoder_app.command("probe")
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

    _setup_logging(False)
    cfg, setup, enc = _encoder_setup(config, overrides, encoder)
    fed = setup.federation
    x = torch.cat([c.train.x for c in fed.clients])
    y = torch.cat([c.train.y for c in fed.clients])
    z, z_test = enc.embed(x, setup.device), enc.embed(fed.test.x, setup.device)
    mean, std = z.mean(0), z.std(0).clamp_min(1e-6)  # standardise: a linear probe's usual step
    probe = torch.nn.Linear(enc.dim, fed.task.num_classes)
    train_classifier(
        probe,
        LabelledData((z - mean) / std, y),
        TrainConfig(epochs, 256, 1e-2, "adam"),
        torch_generator(cfg.seed, "probe"),
        setup.device,
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


@encoder_app.command("attack")
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
    from oneshotfl.attacks import invert, psnr, ssim, to_unit_range
    from oneshotfl.plots import image_grid
    from oneshotfl.privacy import gaussian_release
    from oneshotfl.seeding import torch_generator

    _setup_logging(False)
    try:
        levels = [None if e.strip() == "none" else float(e) for e in epsilons.split(",")]
    except ValueError:
        _fail(ConfigError(f"--epsilons: expected numbers or 'none', got {epsilons!r}"))
    cfg, setup, enc = _encoder_setup(config, overrides, encoder)
    fed = setup.federation
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


from oneshotfl.flower.cli import app as flower_app  # noqa: E402  (imports no flwr)

app.add_typer(flower_app, name="flower")


@encoder_app.command("cost")
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
    from oneshotfl.cost import backbone_forward_flops, client_cost
    from oneshotfl.plots import line_plot

    _setup_logging(False)
    try:  # cheap checks first: the encoder may take minutes to pretrain
        if samples < 1 or head_epochs < 1 or (full_epochs is not None and full_epochs < 1):
            raise ConfigError("samples, head-epochs and full-epochs: expected >= 1")
        priced = [(b.partition("@")[0], int(b.partition("@")[2] or 224)) for b in backbone or []]
    except ValueError as exc:
        _fail(exc)
    cfg, setup, enc = _encoder_setup(config, overrides, encoder)
    fed = setup.federation
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
        _fail(exc)
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


def main() -> None:  # pragma: no cover - console entry point
    app()
