"""What GH-OFL's and FedPFT's messages reveal: the class means of the shared encoder's
features, inverted back to images, against the sending client's data.

Both send, for every class a client holds, its examples' mean feature vector μ_kc (GH-OFL
exactly, as a sum with the count; FedPFT with one component as its Gaussian's mean, in
float16). For each client of each federation of ``benchmarks/stats-privacy.yaml``:

* ``single`` / ``pairs``: the share of its class messages over exactly one example (μ_kc *is*
  that example's features) or two (GH-OFL's per-class Gram then gives the pair up to order);
* the model-inversion attack of the FedAGE audit (:func:`oneshotfl.security.inversion.invert`:
  argmin ‖E(x̂) − μ‖² + λ·TV(x̂), 300 Adam steps, the server knows the frozen encoder) on
  every μ_kc, and FedD3's measures of the images x̂ it gives (``scripts/fedd3_privacy.py``):
  PSNR to the closest of the client's training images vs of label-matched test images, the
  share within 30 dB of a training image, and the nearest-example membership attack's AUC;
  ``psnr_single``: the PSNR of the inversion of single-example classes to that very example.

Writes ``benchmarks/results/NAME/privacy.json`` and splices the table between the
``<!-- report:NAME -->`` markers of ``docs/benchmarks/merging.md``.

Usage: python scripts/stats_privacy.py [benchmarks/stats-privacy.yaml] [MARKDOWN]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedd3_privacy import COPY_DB, audit, cell, publish

from oneshotfl.methods.common import client_embeddings
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import federation_plan
from oneshotfl.security.inversion import invert, psnr, to_unit_range
from oneshotfl.security.membership import label_matched


def client_rows(fed: Federation, client: int, candidates: int, steps: int) -> dict[str, Any]:
    """The module docs' measures for one client's class means."""
    ctx, test, dataset = fed.client_context(client), fed.data.test, fed.cfg.dataset
    assert fed.encoder is not None
    z, y = client_embeddings(ctx), ctx.data.y
    held = sorted(int(c) for c in torch.unique(y))
    counts = {c: int((y == c).sum()) for c in held}
    means = torch.stack([z[y == c].mean(0) for c in held])
    torch.manual_seed(client)
    x_hat = invert(fed.encoder, means, tuple(ctx.data.x.shape[1:]), steps=steps)
    sent = to_unit_range(x_hat, dataset)
    rng = np.random.default_rng(client)
    chosen = rng.choice(len(ctx.data), min(candidates, len(ctx.data)), False)
    members = torch.from_numpy(np.sort(chosen))
    others = label_matched(y[members], test.y, rng, set())
    matched = label_matched(y, test.y, rng, set())
    report = audit(
        sent,
        (to_unit_range(ctx.data.x, dataset), to_unit_range(test.x[matched], dataset)),
        to_unit_range(ctx.data.x[members], dataset),
        to_unit_range(test.x[others], dataset),
    )
    singles = [i for i, c in enumerate(held) if counts[c] == 1]
    own = [to_unit_range(ctx.data.x[y == held[i]], dataset)[0] for i in singles]
    exact = [float(psnr(sent[i : i + 1], o[None])[0]) for i, o in zip(singles, own, strict=True)]
    return {
        "client": client,
        "classes": len(held),
        "single": len(singles) / len(held),
        "pairs": sum(counts[c] == 2 for c in held) / len(held),
        "psnr_single": exact,
        **report,
    }


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/stats-privacy.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/merging.md")
    spec = yaml.safe_load(path.read_text())
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for alpha in spec["alphas"]:
        cfg = make_config({**spec["base"], "alpha": alpha, "methods": ["ghofl"]})
        fed = Federation.prepare(federation_plan(cfg))
        for client in range(cfg.clients):
            row = client_rows(fed, client, spec["candidates"], spec["steps"])
            rows.append({"alpha": alpha, **row})
            shown = {k: v for k, v in row.items() if isinstance(v, float)}
            print(
                f"α {alpha} client {client}: " + ", ".join(f"{k} {v:.3f}" for k, v in shown.items())
            )
    lines = [
        "| Dirichlet α | class messages over 1 / 2 examples | PSNR of a 1-example class's "
        "inversion to its example (dB) | to closest member (dB) | to closest non-member (dB) "
        f"| within {COPY_DB:g} dB of a member | nearest-example attack ROC AUC |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for alpha in spec["alphas"]:
        mine = [r for r in rows if r["alpha"] == alpha]
        exact = [v for r in mine for v in r["psnr_single"]]
        single = f"{statistics.fmean(exact):.1f} (n={len(exact)})" if exact else "– (none)"
        lines.append(
            f"| {alpha} | {cell(mine, 'single', 100)}% / {cell(mine, 'pairs', 100)}% | {single} "
            f"| {cell(mine, 'psnr_member')} | {cell(mine, 'psnr_non_member')} "
            f"| {cell(mine, 'copies', 100)}% | {cell(mine, 'auc', digits=3)} |"
        )
    command = f"python scripts/stats_privacy.py {path}"
    publish(spec, command, rows, start, lines, markdown, "Mean ± std over the clients")


if __name__ == "__main__":
    main(sys.argv)
