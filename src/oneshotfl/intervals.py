"""Uncertainty over seeds: 95% t-intervals of a mean, paired differences, and the claims rule.

Every comparison oneshotfl reports is over seeds: a mean alone cannot tell a real difference
from the spread between federations. Three pure functions serve every table:

* :func:`mean_interval` — the mean of one method's values over seeds and its Student-t
  confidence interval (``level``, default 95%);
* :func:`paired_difference` — ``a - b`` over the seeds both ran (the same federations), and
  its interval: a seed's federation is shared by both methods, so the interval of the paired
  differences is much tighter than two separate intervals;
* :func:`claim_verdict` — the four-verdict rule of the claims page, read off a paired
  interval and the paper's margin.

Fewer than 2 values give an interval marked *not available* with a one-line reason (never a
zero-width interval and never an error): its ``low``/``high`` are ``nan``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from scipy import stats

Verdict = Literal["holds", "in direction", "fails", "inconclusive"]

VERDICTS: tuple[Verdict, ...] = ("holds", "in direction", "fails", "inconclusive")


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values and its confidence interval ``[low, high]``.

    Attributes:
        mean: the mean (``nan`` when there are no values).
        low: the interval's lower end (``nan`` when not available).
        high: the interval's upper end (``nan`` when not available).
        n: how many values (seeds) it rests on.
        level: the confidence level.
        reason: why the interval is not available (``None`` when it is).
    """

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95
    reason: str | None = None

    @property
    def available(self) -> bool:
        """Whether there is an interval (at least 2 values)."""
        return self.reason is None

    @property
    def half_width(self) -> float:
        """Half the interval's width (``nan`` when not available)."""
        return (self.high - self.low) / 2 if self.available else math.nan

    def contains_zero(self) -> bool:
        """Whether 0 lies in the interval (``True`` when not available: nothing is shown)."""
        return not self.available or self.low <= 0.0 <= self.high

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. fractions to points: ``factor=100``)."""
        return Interval(
            self.mean * factor,
            self.low * factor,
            self.high * factor,
            self.n,
            self.level,
            self.reason,
        )

    def text(self, digits: int = 2, signed: bool = False) -> str:
        """``mean ± half`` (or ``mean (n/a: reason)``) for a table cell."""
        sign = "+" if signed else ""
        if not self.available:
            return f"{self.mean:{sign}.{digits}f} (CI n/a)" if self.n else "–"
        return f"{self.mean:{sign}.{digits}f} ± {self.half_width:.{digits}f}"

    def bracket(self, digits: int = 2) -> str:
        """``+mean [low, high]``, or ``+mean (n/a: reason)``: a difference with its interval."""
        if not self.available:
            return f"{self.mean:+.{digits}f} (n/a: {self.reason})" if self.n else "n/a"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def mean_interval(values: Iterable[float], level: float = 0.95) -> Interval:
    """The mean of ``values`` and its Student-t confidence interval at ``level``.

    With fewer than 2 values the interval is not available (``reason`` says why). Values
    that are all equal give a zero-width interval: that is what they show.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"mean_interval: expected a level in (0, 1), got {level}")
    data = [float(v) for v in values]
    if not all(math.isfinite(v) for v in data):
        raise ValueError(f"mean_interval: expected finite values, got {data}")
    n = len(data)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level, "no values")
    mean = math.fsum(data) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, 1, level, "1 seed; an interval needs 2 or more")
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level)


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95
) -> tuple[Interval, list[int]]:
    """``a[s] - b[s]`` over the seeds ``s`` both hold, its mean and interval, and those seeds.

    ``a`` and ``b`` map a seed to one method's value on that seed's federation.
    """
    seeds = sorted(set(a) & set(b))
    return mean_interval((a[s] - b[s] for s in seeds), level), seeds


def difference_words(interval: Interval) -> str:
    """``higher``, ``lower``, ``no measurable difference`` (the interval includes 0) or
    ``n/a`` (there is no interval: fewer than 2 values)."""
    if not interval.available:
        return "n/a"
    if interval.contains_zero():
        return "no measurable difference"
    return "higher" if interval.low > 0 else "lower"


def claim_verdict(interval: Interval, paper_margin: float | None = None) -> Verdict:
    """The claims rule on a paired interval (ours minus the reference, in points).

    * ``holds``: the lower end is at least half the paper's margin (with no margin given —
      a claim of direction only — the lower end is above 0);
    * ``in direction``: the lower end is above 0;
    * ``fails``: the upper end is below 0;
    * ``inconclusive``: anything else, and every interval that is not available.
    """
    if not interval.available:
        return "inconclusive"
    if interval.low > 0 and (paper_margin is None or interval.low >= paper_margin / 2):
        return "holds"
    if interval.low > 0:
        return "in direction"
    if interval.high < 0:
        return "fails"
    return "inconclusive"
