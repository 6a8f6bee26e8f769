"""Run the membership-inference audit of a YAML file and tabulate it (issue 15).

The file names a federation (``base``: an experiment config), the ``methods`` whose uploads
are audited, the audited ``clients`` and the audit's settings (``audit``: see
:class:`oneshotfl.security.membership.AuditConfig`). Writes
``benchmarks/results/NAME/membership.json``
(every client's AUC and TPR per attack) and splices the table, mean ± std over the audited
clients, between the ``<!-- report:NAME -->`` markers of ``docs/benchmarks/security.md``.

Usage: python scripts/membership_audit.py [benchmarks/membership.yaml] [MARKDOWN]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from helpers import prepare
from oneshotfl.methods import build_method
from oneshotfl.params import coerce_params
from oneshotfl.runner.config import make_config
from oneshotfl.runner.report import splice_markdown
from oneshotfl.security.membership import AuditConfig, audit_client, upload_kind

ATTACKS = ("loss", "shadow", "nearest")


def table(rows: list[dict[str, Any]], fpr: float) -> str:
    lines = [
        f"| method | upload | attack | ROC AUC | TPR at {100 * fpr:g}% FPR |",
        "|---|---|---|---:|---:|",
    ]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        for attack in ATTACKS:
            if f"{attack}_auc" not in mine[0]:
                continue
            auc = [r[f"{attack}_auc"] for r in mine]
            tpr = [100 * r[f"{attack}_tpr"] for r in mine]
            lines.append(
                f"| `{method}` | {mine[0]['upload']} | {attack} "
                f"| {statistics.fmean(auc):.3f} ± {statistics.pstdev(auc):.3f} "
                f"| {statistics.fmean(tpr):.1f} ± {statistics.pstdev(tpr):.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/membership.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/security.md")
    spec = yaml.safe_load(path.read_text())
    audit = coerce_params(AuditConfig, spec.get("audit", {}))
    exp = prepare(make_config({**spec["base"], "methods": spec["methods"]}))
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for key in spec["methods"]:
        method = build_method(key)
        for client in spec["clients"]:
            ctx = exp.client_context(client)
            report = audit_client(method, ctx, exp.data.test, audit)
            kind = upload_kind(method.client_update(ctx))
            rows.append({"method": key, "upload": kind, "client": client, **report})
            print(f"{key} client {client}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in report.items() if k.endswith(("auc", "tpr"))
            ))  # fmt: skip
    out = Path("benchmarks/results") / spec["name"]
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "command": f"python scripts/membership_audit.py {path}",
        "config": spec,
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    (out / "membership.json").write_text(json.dumps(document, indent=2) + "\n")
    body = table(rows, audit.fpr)
    body += (
        f"\n\n{len(rows)} audits in {document['seconds'] / 60:.1f} min (`{document['command']}`)."
    )
    splice_markdown(markdown, spec["name"], body)
    print(f"membership audit → {out / 'membership.json'} and {markdown}")


if __name__ == "__main__":
    main(sys.argv)
