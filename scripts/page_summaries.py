"""The summary each benchmark page opens with (issue 52): one table of the page's main methods
on its main federations — accuracy as mean ± the half-width of its 95% t-interval over seeds
(n), upload bytes per client and server seconds — each row linked to the section that holds
its details, all read from the committed result files.

``benchmarks/summaries.yaml`` lists, per page, its settings (a label and the config values
that select it) and its sources: a sweep's results folder, the config values that select its
main federations (``where``), the methods to show (report row names, so a method in several
groups is ``key [group]``; ``as`` renames a row), the section of the page they link to, and
``personal: true`` where the accuracy shown is each client's on its own test data (a
personalised outcome's; per method too, ``{key, personal: true}``). A cell of a method that
did not run in a setting reads "–".
Each page holds the table between ``<!-- report:summary -->`` markers.

Usage: python scripts/page_summaries.py [benchmarks/summaries.yaml]
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from oneshotfl.runner.report import collect, splice_markdown
from oneshotfl.runner.report_plots import human_bytes
from oneshotfl.runner.report_tables import interval_cell
from oneshotfl.runner.results import iter_results

RESULTS = Path("benchmarks/results")


def anchor(heading: str) -> str:
    """GitHub's (and the site's) anchor of a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def selected(results: str, where: dict[str, Any]) -> list[dict[str, Any]]:
    """The result documents of ``RESULTS/results`` whose config has every value of ``where``."""
    docs = [doc for _, doc in iter_results(RESULTS / results)]  # none yet: the row says "–"
    return [d for d in docs if all(d["config"].get(k) == v for k, v in where.items())]


def row(source: dict[str, Any], method: Any, settings: list[dict[str, Any]]) -> str:
    """One method's row: a cell per setting, its upload and server seconds, its link."""
    if isinstance(method, str):
        method = {"key": method}
    key, name = method["key"], method.get("as", method["key"])
    personal = method.get("personal", source.get("personal", False))
    cells, uploads, server = [], [], []
    for setting in settings:
        docs = selected(source["results"], {**source.get("where", {}), **setting["where"]})
        report = collect(docs) if docs else None
        found = [c for (s, m), c in (report.cells.items() if report else []) if m == key]
        if len(found) > 1:
            raise ValueError(f"summaries: {source['results']} {setting['label']}: {key!r} "
                             f"is in {len(found)} settings; narrow its `where`")  # fmt: skip
        if not found:
            cells.append("–")
            continue
        cells.append(interval_cell(found[0].interval(personal=personal)))
        uploads += found[0].upload_bytes
        server += found[0].server_s
    upload = human_bytes(statistics.fmean(uploads)) if uploads else "–"
    seconds = f"{statistics.fmean(server):.1f}" if server else "–"
    link = f"[details](#{anchor(source['section'])})"
    return f"| `{name}` | " + " | ".join(cells) + f" | {upload} | {seconds} | {link} |"


def summary(page: dict[str, Any]) -> str:
    settings = page["settings"]
    head = (
        "| method | " + " | ".join(s["label"] for s in settings)
        + " | upload / client | server s | details |"
    )  # fmt: skip
    lines = [
        f"**Summary** — {page['federations']}. Test accuracy (%), mean ± the half-width of its "
        "95% t-interval over seeds (n); upload per client on the wire; the server's seconds "
        "(mean over the runs, single-threaded, the machine each `result.json` names). "
        f"Regenerate: `python scripts/page_summaries.py`.",
        "",
        head,
        "|---|" + "---:|" * (len(settings) + 2) + "---|",
    ]
    lines += [row(source, m, settings) for source in page["sources"] for m in source["methods"]]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    spec = yaml.safe_load(Path(argv[0] if argv else "benchmarks/summaries.yaml").read_text())
    for page in spec["pages"]:
        path = Path(page["page"])
        text = path.read_text()
        for source in page["sources"]:  # a link to a heading the page does not have is stale
            if not re.search(rf"^#+ {re.escape(source['section'])}\s*$", text, re.MULTILINE):
                raise SystemExit(f"summaries: {path}: no heading {source['section']!r}")
        splice_markdown(path, "summary", summary(page))
        print(f"wrote the summary of {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
