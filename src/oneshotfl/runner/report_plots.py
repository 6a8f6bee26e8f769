"""A benchmark report's data — :class:`Report`, one :class:`Cell` per setting and method, which
:func:`oneshotfl.runner.report.collect` fills — and its plots: accuracy against the settings
that vary (α, clients, a method parameter), against upload bytes, and against communication
rounds."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oneshotfl.intervals import Interval, mean_interval
from oneshotfl.plots import RoundsCurve, line_plot, rounds_plot


@dataclass
class Cell:
    """The runs of one method in one setting (one value per seed)."""

    accuracy: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    """The model seed of each value of ``accuracy`` (the federations paired differences pair)."""
    personal: list[float] = field(default_factory=list)
    personalised: bool = False
    upload_bytes: list[float] = field(default_factory=list)
    histories: list[list[dict[str, Any]]] = field(default_factory=list)
    facts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    server_s: list[float] = field(default_factory=list)
    costs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    method: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def interval(self, personal: bool = False) -> Interval:
        """The mean accuracy over seeds (or the personal accuracy) and its 95% t-interval."""
        return mean_interval(self.personal if personal else self.accuracy)

    def by_seed(self) -> dict[int, float]:
        """Accuracy by model seed (for paired differences)."""
        return dict(zip(self.seeds, self.accuracy, strict=True))

    def mean_ci(self) -> tuple[float, float]:
        """``(mean, half-width of the 95% interval)`` for error bars (0 with one seed)."""
        found = self.interval()
        return found.mean, found.half_width if found.available else 0.0


@dataclass
class Report:
    """Results grouped by setting and method."""

    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    settings: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    alphas: dict[str, tuple[float, str]] = field(default_factory=dict)
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(setting, method) → the one-line reason of each run in which that method failed."""
    runs: int = 0
    wall_time_s: float = 0.0


def natural_key(text: str) -> list[Any]:
    """Sort key that orders the numbers inside ``text`` by value (``5`` before ``10``)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", text)
    return [(0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)]


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def report_plots(report: Report, out_dir: Path, title: str) -> dict[str, Path]:
    """Every plot the report's data supports, written as PNG into ``out_dir``; name → path."""
    plots: dict[str, Path] = {}
    for key, by_method in setting_series(report).items():
        plots[f"accuracy vs {key}"] = line_plot(
            by_method, out_dir / f"accuracy_vs_{key}.png", key, "test accuracy", title
        )
    if len({alpha for alpha, _ in report.alphas.values()}) >= 2:
        series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for (setting, method), cell in report.cells.items():
            if setting in report.alphas:
                alpha, extra = report.alphas[setting]
                name = f"{method} ({extra})" if extra else method
                series[name].append((alpha, *cell.mean_ci()))
        plots["accuracy vs alpha"] = line_plot(
            series,
            out_dir / "accuracy_vs_alpha.png",
            "Dirichlet α",
            "test accuracy",
            title,
            logx=True,
        )
    panels = rounds_panels(report)
    if panels:
        plots["accuracy vs rounds"] = rounds_plot(
            panels, out_dir / "accuracy_vs_rounds.png", title, xfmt=human_bytes
        )
    for (method, param), by_setting in parameter_series(report).items():
        plots[f"{method}: accuracy vs {param}"] = line_plot(
            by_setting,
            out_dir / f"accuracy_vs_{method}_{param}.png",
            f"{method} {param}",
            "test accuracy",
            title,
            logx=param.endswith("epsilon"),
        )
    # a personalised method that communicates (FOL) is judged by its personal accuracy
    personalised = any(c.personalised and max(c.upload_bytes) > 0 for c in report.cells.values())
    for personal in (False, True) if personalised else (False,):
        points = bytes_points(report, personal=personal)
        metric = "personal accuracy" if personal else "accuracy"
        if points:
            plots[f"{metric} vs upload bytes"] = line_plot(
                points,
                out_dir / f"{metric.replace(' ', '_')}_vs_bytes.png",
                "upload bytes per client",
                f"{'personal' if personal else 'test'} accuracy (mean over settings)",
                title,
                logx=True,
                xfmt=human_bytes,
            )
    return plots


def bytes_points(report: Report, personal: bool) -> dict[str, list[tuple[float, float, float]]]:
    """``method → [(upload bytes per client, mean, half-width)]`` of every method that uploads:
    test accuracy, or with ``personal`` the personal accuracy (each client's final model on its
    own label distribution; methods without one for every run are left out). The mean is over
    settings (each setting's mean over its seeds); the error bar is the half-width of the 95%
    t-interval over seeds of each seed's mean over the settings it ran — the spread between
    federations, not between settings (no bar with one seed)."""
    points: dict[str, list[tuple[float, float, float]]] = {}
    for method in report.methods:
        cells = [c for (_, m), c in report.cells.items() if m == method]
        upload = float(np.mean([b for c in cells for b in c.upload_bytes]))
        if upload <= 0 or (personal and any(len(c.personal) != len(c.accuracy) for c in cells)):
            continue
        means = [float(np.mean(c.personal if personal else c.accuracy)) for c in cells]
        by_seed: dict[int, list[float]] = defaultdict(list)
        for c in cells:
            for seed, value in zip(c.seeds, c.personal if personal else c.accuracy, strict=True):
                by_seed[seed].append(value)
        found = mean_interval(float(np.mean(v)) for v in by_seed.values())
        spread = found.half_width if found.available else 0.0
        points[method] = [(upload, float(np.mean(means)), spread)]
    return points


def setting_series(report: Report) -> dict[str, dict[str, list[tuple[float, float, float]]]]:
    """When settings differ in exactly one numeric config key besides the partition (e.g.
    ``clients``), ``key → method → [(value, mean, half-width)]`` for an accuracy-vs-key plot."""
    keys = {k for extras in report.extras.values() for k in extras}
    labels = {s.split(" · ")[0] for s in report.settings}  # the partition part
    if len(keys) != 1 or len(labels) != 1 or len(report.settings) < 2:
        return {}
    (key,) = keys
    values = [report.extras[s][key] for s in report.settings]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return {}
    series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for (setting, method), cell in report.cells.items():
        series[method].append((float(report.extras[setting][key]), *cell.mean_ci()))
    return {key: dict(series)}


def parameter_series(
    report: Report, minimum: int = 3
) -> dict[tuple[str, str], dict[str, list[tuple[float, float, float]]]]:
    """Sweeps of one hyper-parameter: for every method run as ``name`` and as several
    ``name:param=value`` variants that differ from it in that one numeric parameter,
    ``(name, param) → setting → [(value, mean, half-width)]`` (the plain ``name`` row sits at its
    default value when that is a number). Kept when a setting has ``minimum`` points."""
    out: dict[tuple[str, str], dict[str, list[tuple[float, float, float]]]] = defaultdict(dict)
    for setting in report.settings:
        cells = [(k, c) for (s, k), c in report.cells.items() if s == setting]
        defaults = {c.method: c.params for k, c in cells if k == c.method}
        found: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        for key, cell in cells:
            base = defaults.get(cell.method)
            if base is None or key == cell.method:
                continue
            changed = [p for p in cell.params if cell.params[p] != base.get(p)]
            value = cell.params[changed[0]] if len(changed) == 1 else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                found[(cell.method, changed[0])].append((float(value), *cell.mean_ci()))
        for (method, param), points in found.items():
            default = defaults[method].get(param)
            if isinstance(default, int | float) and not isinstance(default, bool):
                points.append((float(default), *report.cells[(setting, method)].mean_ci()))
            if len(points) >= minimum:
                out[(method, param)][setting] = points
    return dict(out)


#: One-shot methods drawn as references in the rounds plot (FedOL's Fig. 2 legend).
ROUNDS_REFERENCES = ("fedol", "fedavg", "fedprox", "feddf", "fedhkt", "fedet", "mine")


def rounds_panels(
    report: Report, references: tuple[str, ...] = ROUNDS_REFERENCES
) -> dict[str, tuple[dict[str, RoundsCurve], dict[str, tuple[float, float]]]]:
    """Per setting with a multi-round method: its curves (mean ± 95% half-width over seeds of every
    round) and the one-shot reference methods' mean accuracy and upload bytes."""
    panels: dict[str, tuple[dict[str, RoundsCurve], dict[str, tuple[float, float]]]] = {}
    for setting in report.settings:
        curves: dict[str, RoundsCurve] = {}
        one_shot: dict[str, tuple[float, float]] = {}
        for (s, key), cell in report.cells.items():
            if s != setting:
                continue
            if cell.histories:
                rounds = min(len(h) for h in cell.histories)
                curve = []
                for r in range(rounds):
                    accs = np.array([h[r]["accuracy"] for h in cell.histories], dtype=float)
                    sizes = np.mean([h[r]["upload_bytes_mean"] for h in cell.histories])
                    found = mean_interval(accs.tolist())
                    half = found.half_width if found.available else 0.0
                    curve.append((float(r + 1), found.mean, half, float(sizes)))
                curves[key] = curve
            elif cell.method in references:
                one_shot[key] = (cell.mean_ci()[0], float(np.mean(cell.upload_bytes)))
        if curves:
            panels[setting] = (curves, one_shot)
    return panels
