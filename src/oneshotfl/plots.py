"""PNG figures: partition heatmaps and benchmark plots (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def partition_heatmap(counts: np.ndarray, path: Path, title: str = "") -> Path:
    """A client × class heatmap of example counts, with the counts written in the cells."""
    n_clients, n_classes = counts.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * n_classes, 1.0 + 0.4 * n_clients))
    image = ax.imshow(counts, cmap="Blues", aspect="auto")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_xticks(range(n_classes))
    ax.set_yticks(range(n_clients))
    if n_clients * n_classes <= 400:
        threshold = counts.max() / 2 if counts.size else 0
        for (i, j), value in np.ndenumerate(counts):
            color = "white" if value > threshold else "black"
            ax.text(j, i, str(value), ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=ax, label="examples")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


Series = Mapping[str, Sequence[tuple[float, float, float]]]


def line_plot(
    series: Series,
    path: Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    xfmt: Callable[[float], str] = "{:g}".format,
) -> Path:
    """One line per series of ``(x, mean, std)`` points, with error bars.

    With ``logx`` and at most 8 distinct x values, the ticks sit on the measured points and
    are labelled by ``xfmt``.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, points in sorted(series.items()):
        pts = sorted(points)
        xs, ys, es = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)
    if logx:
        ax.set_xscale("log")
        ticks = sorted({x for points in series.values() for x, _, _ in points})
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
