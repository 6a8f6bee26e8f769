"""PNG figures: partition heatmaps and benchmark plots (matplotlib, headless)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the headless Agg backend, imported on the first figure (a run
    that draws nothing, a Flower node's ClientApp above all, does not pay its import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def partition_heatmap(
    counts: np.ndarray, path: Path, title: str = "", class_names: Sequence[str] = ()
) -> Path:
    """A client × class heatmap of example counts, with the counts written in the cells (up to
    400 cells). Past 40 clients the figure stops growing (a 10,000-client federation is one
    screen, not 4,000 inches) and at most 20 client ticks are labelled. Classes are labelled
    with ``class_names`` when given (slanted when long); a long title wraps."""
    plt = _pyplot()
    n_clients, n_classes = counts.shape
    names = [str(n) for n in class_names] if len(class_names) == n_classes else []
    slant = any(len(n) > 3 for n in names)
    height = 1.0 + 0.4 * min(n_clients, 40) + (0.08 * max(map(len, names)) if slant else 0)
    width = max(1.0 + 0.55 * n_classes, 4.0)
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(counts, cmap="Blues", aspect="auto", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_xticks(range(n_classes))
    if names:
        ax.set_xticklabels(names, rotation=45 if slant else 0, ha="right" if slant else "center")
    ax.set_yticks(range(0, n_clients, max(1, -(-n_clients // 20))))
    if n_clients * n_classes <= 400:
        threshold = counts.max() / 2 if counts.size else 0
        for (i, j), value in np.ndenumerate(counts):
            color = "white" if value > threshold else "black"
            ax.text(j, i, str(value), ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=ax, label="examples")
    ax.set_title(textwrap.fill(title, width=max(20, int(width * 9))), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


Series = Mapping[str, Sequence[tuple[float, float, float]]]


def spaced_ticks(values: Sequence[float], ratio: float = 1.15) -> list[float]:
    """The sorted positive ``values`` a log axis can label without overlap: each kept value is
    at least ``ratio`` times the previous kept one (242 KiB and 242.2 KiB share one label)."""
    kept: list[float] = []
    for value in sorted(values):
        if value > 0 and (not kept or value >= ratio * kept[-1]):
            kept.append(value)
    return kept


def line_plot(
    series: Series,
    path: Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    xfmt: Callable[[float], str] = "{:g}".format,
) -> Path:
    """One line per series of ``(x, mean, error)`` points, with error bars (in the reports:
    the half-width of the 95% interval over seeds).

    With ``logx`` and at most 8 distinct x values, the ticks sit on the measured points and
    are labelled by ``xfmt``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, points in sorted(series.items()):
        pts = sorted(points)
        xs, ys, es = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    if logx:
        ax.set_xscale("log")
        ticks = spaced_ticks(sorted({x for points in series.values() for x, _, _ in points}))
        if len(ticks) <= 8:  # label the measured points, not powers of ten
            ax.set_xticks(ticks, [xfmt(t) for t in ticks])
            ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


#: One multi-round method in one setting: ``(round, mean, error, cumulative upload bytes)``.
RoundsCurve = Sequence[tuple[float, float, float, float]]


def rounds_plot(
    panels: Mapping[str, tuple[Mapping[str, RoundsCurve], Mapping[str, tuple[float, float]]]],
    path: Path,
    title: str = "",
    xfmt: Callable[[float], str] = "{:g}".format,
) -> Path:
    """Accuracy against rounds (top row) and against cumulative upload bytes per client
    (bottom row), one column per setting.

    Each panel is ``(curves, one_shot)``: multi-round methods as curves with error bars, and
    one-shot methods as ``name → (mean accuracy, upload bytes)``, drawn as dashed horizontal
    lines on top and as single points (one round's bytes) below.
    """
    plt = _pyplot()
    from matplotlib import ticker

    n = len(panels)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 7.0), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, (setting, (curves, one_shot)) in enumerate(panels.items()):
        top, bottom = axes[0][col], axes[1][col]
        for i, (name, curve) in enumerate(sorted(one_shot.items())):
            colour = colours[(i + len(curves)) % len(colours)]
            top.axhline(curve[0], ls="--", lw=1, color=colour, label=name)
            bottom.plot([curve[1]], [curve[0]], ls="none", marker="s", color=colour, label=name)
        for i, (name, points) in enumerate(sorted(curves.items())):
            rounds, means, errors, sizes = (
                np.array(v, dtype=float) for v in zip(*points, strict=True)
            )
            colour = colours[i % len(colours)]
            top.errorbar(
                rounds, means, yerr=errors, marker="o", capsize=3, color=colour, label=name
            )
            bottom.errorbar(
                sizes, means, yerr=errors, marker="o", capsize=3, color=colour, label=name
            )
        top.set_title(setting, fontsize=9)
        top.set_xlabel("communication rounds")
        bottom.set_xlabel("upload bytes per client (cumulative)")
        bottom.set_xscale("log", base=2)  # bytes: ticks at 256 KiB, 512 KiB, 1 MiB, …
        bottom.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: xfmt(v)))
        bottom.xaxis.set_minor_formatter(ticker.NullFormatter())
        top.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        for ax in (top, bottom):
            ax.set_ylabel("test accuracy")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def image_grid(rows: Mapping[str, np.ndarray], path: Path, title: str = "") -> Path:
    """One row per label of ``[N, C, H, W]`` images in [0, 1] (grey or RGB)."""
    plt = _pyplot()
    labels = list(rows)
    n = max(len(v) for v in rows.values())
    fig, axes = plt.subplots(
        len(labels), n, figsize=(1.1 * n + 1.2, 1.15 * len(labels)), squeeze=False
    )
    for r, label in enumerate(labels):
        for c in range(n):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(rows[label]):
                img = np.transpose(rows[label][c], (1, 2, 0))
                shown = img.squeeze(-1) if img.shape[-1] == 1 else img
                ax.imshow(shown, cmap="gray", vmin=0, vmax=1)
            if c == 0:
                ax.set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
