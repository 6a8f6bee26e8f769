"""What every ``oneshotfl`` command shares: consoles, logging, the user errors that end a
command with one line instead of a traceback, and the tables commands print. The command
options generated from a frozen config dataclass are in :mod:`oneshotfl.cli.options`."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from oneshotfl.data.datasets import DatasetFormatError, DatasetNotFoundError
from oneshotfl.data.partition import PartitionError
from oneshotfl.registry import RegistryError
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import QuorumError
from oneshotfl.runner.report import collect, human_bytes, setting_label
from oneshotfl.runner.report_tables import interval_cell

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns; give them room.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

USER_ERRORS = (
    ConfigError,
    RegistryError,
    DatasetNotFoundError,
    DatasetFormatError,
    PartitionError,
    QuorumError,
    FileNotFoundError,
)


def setup_logging(verbose: bool) -> None:
    """INFO lines through rich on stderr; ``verbose``: oneshotfl's own DEBUG lines too (not
    the libraries': matplotlib alone logs hundreds of font lines at DEBUG)."""
    import logging

    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, show_time=False)],
        force=True,
    )
    logging.getLogger("oneshotfl").setLevel(logging.DEBUG if verbose else logging.INFO)


def fail(exc: BaseException) -> NoReturn:
    """End the command with one red line naming the problem (exit code 2)."""
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
    raise typer.Exit(2)


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
        "peer s",
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
            f"{_mean(r.get('client_own_s', r['client_wall_s'])):.2f}",
            f"{r['server_wall_s']:.2f}",
            f"{_mean(r['receiver_wall_s']):.2f}" if r.get("receiver_wall_s") else "",
        )
    for key in doc.get("failed_methods") or {}:
        table.add_row(f"[red]{escape(key)}[/]", "[red]failed[/]", "", "", "", "", "", "")
    shared = doc.get("shared_client_training") or []
    if shared:
        table.caption = "client s: each method's own client time; shared client training: " + (
            "; ".join(
                f"{s['kind']} {s['seconds_per_client']:.2f} s/client ({', '.join(s['methods'])})"
                for s in shared
            )
        )
    return table


def exit_if_failed(docs: Sequence[Mapping[str, Any]]) -> None:
    """After a run's results are written: name every method that failed, with its one-line
    reason, and end the command with exit code 1 (0 when none did)."""
    failed = [(k, why) for doc in docs for k, why in (doc.get("failed_methods") or {}).items()]
    if not failed:
        return
    for key, why in failed:
        err_console.print(f"[bold red]failed:[/] {escape(key)}: {escape(why)}")
    err_console.print(
        f"[bold red]{len(failed)} method run(s) failed[/]; the others' results were written"
    )
    raise typer.Exit(1)


def seeds_table(docs: Sequence[Mapping[str, Any]]) -> Table:
    """Mean ± the half-width of the 95% t-interval over the runs of one setting that differ in
    their seed (the runs of ``run --seed 0,1,2``): each method's test and personal accuracy (%)."""
    report = collect(docs)
    table = Table(title=f"mean ± 95% interval (Student t) over {len(docs)} seeds")
    for name in ("method", "setting", "accuracy", "personal", "runs"):
        table.add_column(name, justify="left" if name in ("method", "setting") else "right")
    for (setting, method), cell in report.cells.items():
        table.add_row(
            method,
            setting,
            interval_cell(cell.interval()),
            interval_cell(cell.interval(personal=True)) if cell.personal else "",
            str(len(cell.accuracy)),
        )
    return table


def _mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def parse_seeds(text: str | None) -> list[int]:
    """``--seed``: one seed, or a comma-separated list (``0,1,2``); none: the config's."""
    if text is None:
        return []
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seed: expected integers such as 0 or 0,1,2, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seed: expected distinct integers such as 0,1,2, got {text!r}")
    return seeds


def cache_summary(doc: dict[str, Any]) -> str:
    """What the artefact cache did: ``cache: 15 computed, 25 reused within the run, 0 read
    from earlier runs`` (a result written before the disk reads were counted: ``cache: 25
    hits, 15 misses``), or with no disk cache what was reused within the run."""
    cache = doc["cache"]
    hits, misses = cache["hits"], cache["misses"]
    if not doc["config"].get("cache_dir"):
        return f"no disk cache: {misses} artefacts computed, {hits} reuses within the run"
    if "from_disk" not in cache:
        return f"cache: {hits} hits, {misses} misses"
    disk = cache["from_disk"]
    return (
        f"cache: {misses} computed, {hits - disk} reused within the run, "
        f"{disk} read from earlier runs"
    )


def compare_summary(summary: dict[str, Any]) -> str:
    """``compared 3 run(s): 3 identical, 0 differ (12 of 12 method rows identical)``."""
    runs, same = summary["runs"], summary.get("runs_identical", 0)
    text = f"compared {runs} run(s): {same} identical, {runs - same} differ"
    if "method_rows" in summary:
        text += f" ({summary['method_rows_identical']} of {summary['method_rows']} method rows"
        text += " identical)"
    if summary.get("methods_changed_as_intended"):
        text += f"; changed as intended: {', '.join(summary['methods_changed_as_intended'])}"
    return text


def counts_table(counts: np.ndarray, title: str) -> Table:
    """A client × class count matrix as a table: a row per client, then its total."""
    table = Table(title=title)
    table.add_column("client", justify="right")
    for k in range(counts.shape[1]):
        table.add_column(str(k), justify="right")
    table.add_column("total", justify="right")
    for cid, row in enumerate(counts):
        table.add_row(str(cid), *(str(v) for v in row), str(row.sum()))
    return table
