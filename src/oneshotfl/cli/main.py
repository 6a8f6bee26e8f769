"""The ``oneshotfl`` command: run, sweep, report, partition, list, describe — command wiring
only. The encoder research commands live in :mod:`oneshotfl.cli.encoders`, the Flower ones in
:mod:`oneshotfl.flower.cli`; ``run``'s options are generated from
:class:`~oneshotfl.runner.config.ExperimentConfig`."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from oneshotfl import api
from oneshotfl._version import __version__
from oneshotfl.cli.describe import describe_method
from oneshotfl.cli.options import (
    RUN_HELP,
    PluginOption,
    SaveModelsOption,
    TrackDirOption,
    TrackExperimentOption,
    TrackOption,
    TrackRunOption,
    VerboseOption,
    config_options,
    with_options,
)
from oneshotfl.cli.support import (
    USER_ERRORS,
    cache_summary,
    compare_summary,
    console,
    counts_table,
    err_console,
    exit_if_failed,
    fail,
    parse_seeds,
    results_table,
    seeds_table,
    setup_logging,
)
from oneshotfl.data.datasets import DATASETS, load_dataset
from oneshotfl.data.federated import carve_federated_data
from oneshotfl.data.partition import PARTITIONERS
from oneshotfl.methods import METHODS
from oneshotfl.models import MODELS
from oneshotfl.plots import partition_heatmap
from oneshotfl.plugins import PluginError, load_plugins
from oneshotfl.protocol.graph import GRAPHS
from oneshotfl.registry import Registry, RegistryError
from oneshotfl.runner.compare import compare_paths
from oneshotfl.runner.config import (
    ConfigError,
    ExperimentConfig,
    load_config,
    make_config,
    parse_overrides,
)
from oneshotfl.runner.files import atomic_write_text
from oneshotfl.runner.report import splice_markdown, write_report
from oneshotfl.runner.sweep import load_sweep
from oneshotfl.security.threats import ATTACKS
from oneshotfl.training.components import COMPONENTS
from oneshotfl.training.progress import RichTracker

app = typer.Typer(
    help="One-shot federated learning: run methods, sweeps and reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
log = logging.getLogger("oneshotfl")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"oneshotfl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = None,
) -> None:
    """One-shot federated learning: run methods, sweeps and reports."""


RUN_OPTIONS = config_options(
    ExperimentConfig,
    names={"methods": ("--method", "--methods"), "plugins": ("--plugin", "--plugins")},
    skip=("cache_dir", "seed"),
)


@app.command(help=RUN_HELP)
@with_options(RUN_OPTIONS)
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value config overrides")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="do not use the artefact cache")
    ] = False,
    cache_dir: Annotated[str | None, typer.Option(help="artefact cache directory")] = None,
    out: Annotated[Path | None, typer.Option(help="results directory")] = None,
    track: TrackOption = None,
    track_dir: TrackDirOption = None,
    track_experiment: TrackExperimentOption = None,
    track_run: TrackRunOption = None,
    save_models: SaveModelsOption = False,
    seed: Annotated[
        str | None,
        typer.Option(
            help="the model seed root (default: 0); several (0,1,2): one run per seed, in "
            "OUT/seed=S"
        ),
    ] = None,
    verbose: VerboseOption = False,
    report_dir: Annotated[
        Path | None,
        typer.Option("--report", help="then write its report here, as `oneshotfl report` does"),
    ] = None,
    **options: Any,
) -> None:
    """Run methods on one federation (the command's help: :data:`RUN_HELP`)."""
    setup_logging(verbose)
    cli = {k: v for k, v in options.items() if v is not None}
    if cache_dir is not None:
        cli["cache_dir"] = cache_dir or None
    if no_cache:
        cli["cache_dir"] = None
    try:
        seeds = parse_seeds(seed)
        if len(seeds) == 1:
            cli["seed"] = seeds[0]
        cfg = load_config(config, overrides or [], cli)
        out_dir = out or Path("runs") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        if len(seeds) > 1 and track_run:
            raise ConfigError("--track-run names one run; with several seeds each is seed=S")
        if len(seeds) > 1:  # one run per seed: a sweep over the seeds, checked up front
            spec = {"name": out_dir.name, "base": {**cfg.to_dict(), "seed": 0}, "seeds": seeds}
            with RichTracker(err_console) as progress:
                done = api.sweep(
                    spec, out_dir, tracker=progress, track=track or (), track_dir=track_dir,
                    track_experiment=track_experiment, save_models=save_models,
                    on_result=lambda _, doc: console.print(results_table(doc)),
                    argv=sys.argv[1:],
                )  # fmt: skip
            console.print(seeds_table([r.to_dict() for r in done.results.values()]))
            console.print(f"results: {len(done.ran)} run(s), one per seed, in {out_dir}")
            exit_if_failed([done[r].to_dict() for r in done.ran])
            return
        with RichTracker(err_console) as progress:
            result = api.run(
                cfg,
                out_dir,
                tracker=progress,
                track=track or (),
                track_dir=track_dir,
                track_experiment=track_experiment,
                track_run=track_run,
                save_models=save_models,
            )
        doc, path = result.to_dict(), result.path
    except USER_ERRORS as exc:
        fail(exc)
    console.print(results_table(doc))
    console.print(f"results: {path}  ({cache_summary(doc)}; {doc['wall_time_s']:.1f} s)")
    if report_dir is not None:
        report(out_dir, report_dir)
    exit_if_failed([doc])


@app.command()
def partition(
    dataset: Annotated[str, typer.Option(help="dataset name")] = "fashion_mnist",
    data_root: Annotated[str | None, typer.Option(help="dataset directory")] = None,
    partition: Annotated[str, typer.Option("--partition", "-p", help="partitioner")] = "dirichlet",
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration")] = 0.5,
    classes_per_client: Annotated[int, typer.Option(help="#C for pathological and skew")] = 2,
    psi: Annotated[float, typer.Option(help="ψ for skew: share from dominant classes")] = 0.7,
    clients: Annotated[int, typer.Option(help="number of clients")] = 10,
    public_size: Annotated[int, typer.Option(help="public pool size")] = 0,
    max_train: Annotated[int | None, typer.Option(help="subsample the training split")] = None,
    seed: Annotated[int, typer.Option(help="partition seed")] = 0,
    png: Annotated[Path | None, typer.Option(help="save a heatmap PNG here")] = None,
) -> None:
    """Print the client × class count matrix of a partition (and save a heatmap)."""
    options = {k: v for k, v in locals().items() if k != "png"}  # each one a config key
    setup_logging(False)
    try:
        cfg = make_config(options)
        fed = carve_federated_data(
            load_dataset(cfg.dataset, cfg.data_root),
            clients=cfg.clients,
            partitioner=cfg.partitioner(),
            seed=cfg.data_seed,
            public_size=cfg.public_size,
            max_train=cfg.max_train,
        )
    except USER_ERRORS as exc:
        fail(exc)
    counts = fed.label_histograms()
    title = f"{dataset} · {partition} · {clients} clients"
    console.print(counts_table(counts, f"{title} · seed {seed}"))
    if png is not None:
        partition_heatmap(counts, png, title, fed.task.class_names)
        console.print(f"heatmap: {png}")


REGISTRIES: dict[str, Registry[Any]] = {
    "methods": METHODS,
    "models": MODELS,
    "datasets": DATASETS,
    "partitioners": PARTITIONERS,
    "components": COMPONENTS,
    "graphs": GRAPHS,
    "attacks": ATTACKS,
}


def _plugins(modules: list[str] | None) -> None:
    try:
        load_plugins(modules or ())
    except PluginError as exc:
        fail(exc)


@app.command("list")
def list_(
    what: Annotated[
        str,
        typer.Argument(help="methods|models|datasets|partitioners|components|graphs|attacks"),
    ],
    plugin: PluginOption = None,
) -> None:
    """Print a registry: each name, then its description.

    Installed plugins and --plugin modules are included."""
    _plugins(plugin)
    registry = REGISTRIES.get(what)
    if registry is None:
        fail(ValueError(f"expected one of {', '.join(REGISTRIES)}, got {what!r}"))
        return
    width = max(len(n) for n in registry.names())
    for entry in registry.entries():
        typer.echo(f"{entry.name:<{width}}  {entry.description}")


@app.command()
def describe(
    method: Annotated[str, typer.Argument(help="a registered method name")],
    plugin: PluginOption = None,
) -> None:
    """Print a method's paper, deviations and choices, requirements and hyper-parameters."""
    _plugins(plugin)
    try:
        typer.echo(describe_method(method))
    except RegistryError as exc:
        fail(exc)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="sweep YAML")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value config overrides for every point")
    ] = None,
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
    claim: Annotated[
        bool,
        typer.Option("--claim", help="with --shard K/N: the N processes claim points as they go"),
    ] = False,
    track: TrackOption = None,
    track_dir: TrackDirOption = None,
    track_experiment: TrackExperimentOption = None,
    save_models: SaveModelsOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Run every point of a sweep grid; finished runs are skipped (resume).

    Every point to run is checked before the first one trains.

    With --track each point is one tracked run, grouped under the sweep's name."""
    setup_logging(verbose)
    try:
        spec = load_sweep(file)
        changes = parse_overrides(overrides or [])
    except USER_ERRORS as exc:
        fail(exc)
    root = out or Path("runs") / spec.name
    start = time.perf_counter()
    try:
        with RichTracker(err_console) as progress:
            done = api.sweep(
                file,
                root,
                shard,
                seeds=seeds,
                force=force,
                tracker=progress,
                track=track or (),
                track_dir=track_dir,
                overrides=changes,
                on_result=lambda _, doc: console.print(results_table(doc)),
                track_experiment=track_experiment,
                save_models=save_models,
                argv=sys.argv[1:],
                claim=claim,
            )
    except USER_ERRORS as exc:
        fail(exc)
    elapsed = time.perf_counter() - start
    console.print(f"sweep {spec.name}: {len(done.ran)} run(s) in {elapsed / 60:.1f} min → {root}")
    exit_if_failed([done[r].to_dict() for r in done.ran])


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
    baseline: Annotated[
        str | None,
        typer.Option(
            help="the method the others are paired against (default: fedavg, else the first)"
        ),
    ] = None,
) -> None:
    """Mean ± 95% interval over seeds and paired differences against a baseline method, as
    markdown tables, CSV (summary.csv, paired.csv) and PNG plots."""
    setup_logging(False)
    out_dir = out or results / "report"
    try:
        _, text = write_report(
            results,
            out_dir,
            str(results.name),
            link_from=markdown.parent if markdown else None,
            baseline=baseline,
        )
        if markdown is not None:
            splice_markdown(markdown, section or results.name, text)
    except (*USER_ERRORS, ValueError) as exc:
        fail(exc)
    console.print(text, markup=False)
    console.print(f"report: {out_dir}", markup=False)


@app.command()
def compare(
    reference: Annotated[Path, typer.Argument(help="a result.json, or a folder of runs")],
    other: Annotated[Path, typer.Argument(help="the same, from the run to check")],
    out: Annotated[Path | None, typer.Option(help="write the comparison as JSON here")] = None,
    changed: Annotated[
        list[str] | None,
        typer.Option(help="a method whose results are meant to differ (repeatable)"),
    ] = None,
) -> None:
    """Exit 1 unless two runs (or folders of runs) have identical metrics, bytes, clients.

    Folders are paired by path — e.g. a sweep before and after a change of the code."""
    try:
        report = compare_paths(reference, other, changed or ())
    except ValueError as exc:
        fail(exc)
    if out is not None:
        atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    for run, lines in report.get("config_differences", {}).items():
        err_console.print(f"{run}: the configs differ in {'; '.join(lines)}", markup=False)
    for run, lines in report.get("other_kernels", {}).items():
        note = "its numbers need not be bit-identical (docs/benchmarks/reproducibility.md)"
        err_console.print(f"{run}: ran on other kernels ({'; '.join(lines)}): {note}", markup=False)
    bad = {run: diffs for run, diffs in report["runs"].items() if diffs}
    for run, diffs in bad.items():
        for line in diffs[:5]:
            err_console.print(f"{run}: {line}", markup=False)
        if len(diffs) > 5:
            err_console.print(f"{run}: … and {len(diffs) - 5} more difference(s)", markup=False)
    console.print(compare_summary(report["summary"]), markup=False)
    if bad:
        raise typer.Exit(1)


from oneshotfl.cli.encoders import app as encoder_app  # noqa: E402
from oneshotfl.flower.cli import app as flower_app  # noqa: E402  (imports no flwr)

app.add_typer(encoder_app, name="encoder")
app.add_typer(flower_app, name="flower")


def main() -> None:  # pragma: no cover - console entry point
    app()
