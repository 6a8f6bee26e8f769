"""Rewrite every report section of the benchmark pages from the committed result files.

A section ``<!-- report:NAME -->`` of ``docs/benchmarks/*.md`` that ``oneshotfl report`` wrote
(``scripts/sweep_shards.sh`` and the Makefile's bench targets splice one per sweep) is written
again from ``benchmarks/results/NAME`` with today's report code — tables, intervals, paired
differences and plots — without running anything. Use it after a change to the report format.
Sections written by other scripts (the claims, the authors' plugins, Flower, …) are left as
they are and listed.

Usage: python scripts/refresh_reports.py [NAME ...]   (default: every such section)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from oneshotfl.runner.report import splice_markdown, write_report

PAGES = Path("docs/benchmarks")
RESULTS = Path("benchmarks/results")
FIGURES = Path("docs/figures")
WRITTEN_BY_REPORT = "Upload per client (bytes counted on the wire"
"""Text every section ``oneshotfl report`` writes holds, and no other script's does."""


def report_sections() -> dict[str, Path]:
    """``NAME → page`` of every section ``oneshotfl report`` wrote."""
    found: dict[str, Path] = {}
    for page in sorted(PAGES.glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"<!-- report:([\w-]+) -->(.*?)<!-- /report:\1 -->", text, re.S):
            if WRITTEN_BY_REPORT in match.group(2) and (RESULTS / match.group(1)).is_dir():
                found[match.group(1)] = page
    return found


def main(names: list[str]) -> None:
    sections = report_sections()
    unknown = sorted(set(names) - set(sections))
    if unknown:
        raise SystemExit(
            f"refresh_reports: expected sections oneshotfl report wrote "
            f"({', '.join(sorted(sections))}), got {', '.join(unknown)}"
        )
    for name in names or sorted(sections):
        page = sections[name]
        _, text = write_report(RESULTS / name, FIGURES / name, name, link_from=page.parent)
        splice_markdown(page, name, text)
        print(f"{page}: {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
