"""Plot helpers: a log axis labels the measured points without overlapping labels."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image

from oneshotfl.plots import line_plot, spaced_ticks


def test_spaced_ticks_drop_values_too_close_to_label_apart() -> None:
    kib = 1024.0
    values = [241.91 * kib, 242.24 * kib, 117.3 * kib, 983.0 * kib, 0.0]
    assert spaced_ticks(values) == [117.3 * kib, 241.91 * kib, 983.0 * kib]
    assert spaced_ticks([1.0, 1.1, 1.2, 1.3, 1.4]) == [1.0, 1.2, 1.4]  # ≥ 1.15 × the last kept
    assert spaced_ticks([]) == []


def test_a_log_plot_of_near_equal_uploads_is_written(tmp_path: Path) -> None:
    series = {"a": [(241.91 * 1024, 0.5, 0.0)], "b": [(242.24 * 1024, 0.6, 0.01)]}
    path = line_plot(series, tmp_path / "p.png", "bytes", "accuracy", logx=True)
    assert matplotlib.image.imread(path).shape[:2] == (504, 780)  # 6.5 × 4.2 in at 120 dpi
