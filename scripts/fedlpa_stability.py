"""Where FedLPA's gradient descent (the authors' ``newton_solve``) is stable, per layer.

For every grid point and seed of ``benchmarks/authors-fedlpa.yaml`` and both K-FAC scalings
(``fedlpa:scaling=kfc|kfac_pytorch``), the clients' factors are formed as in a run (cached with
it), damped by FedLPA's γ, and for every layer the largest eigenvalue of the merge's operator
T(M) = Σ_k p_k G̃_k M Ã_k (:func:`~oneshotfl.methods.kfac.kfac_largest_eigenvalue`) is set
against √N, N the layer's entries: the descent at the authors' lr 1 on the *mean* squared
residual converges only while λ_max(T) < √N (``ratio`` < 1). Beside it, how the damping γI
weighs against each factor: γ over the factor's mean eigenvalue (tr F / d, averaged over the
clients), for A and G — the only thing the two scalings change (A/S², G·S² for a convolution
with S output locations leave A ⊗ G as it is).

Writes ``benchmarks/results/fedlpa-stability/stability.json`` and splices the table between the
``<!-- report:fedlpa-stability -->`` markers of ``docs/benchmarks/merging.md``.

Usage: python scripts/fedlpa_stability.py [benchmarks/authors-fedlpa.yaml] [MARKDOWN]
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedd3_privacy import publish

from oneshotfl.methods import build_method
from oneshotfl.methods.fedlpa import FedLPA
from oneshotfl.methods.kfac import damped, kfac_largest_eigenvalue, merge_kfac_layers
from oneshotfl.protocol.layer_stats import kfac_layers
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import federation_plan

SCALINGS = ("kfc", "kfac_pytorch")


def points(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid's points (one axis of lists per entry, as the sweep expands them) × seeds."""
    out = []
    for entry in spec["grid"]:
        axes = {k: v if isinstance(v, list) else [v] for k, v in entry.items()}
        for values in itertools.product(*axes.values()):
            out += [{**dict(zip(axes, values, strict=True)), "seed": s} for s in spec["seeds"]]
    return out


def layer_rows(fed: Federation, clients: int, scaling: str) -> list[dict[str, Any]]:
    """λ_max(T), √N, their ratio and γ over A's and G's mean eigenvalues, per K-FAC layer."""
    method = build_method(f"fedlpa:scaling={scaling}")
    assert isinstance(method, FedLPA)
    payloads = {c: method.client_update(fed.client_context(c)) for c in range(clients)}
    gamma, found = method.config.damping, []

    def measure(
        start: torch.Tensor, w: torch.Tensor, a: torch.Tensor, g: torch.Tensor, p: torch.Tensor
    ) -> torch.Tensor:
        largest = kfac_largest_eigenvalue(damped(a, gamma), damped(g, gamma), p)
        mean_eig = [float(f.diagonal(dim1=-2, dim2=-1).mean()) for f in (a, g)]
        found.append((largest, math.sqrt(start.numel()), *(gamma / e for e in mean_eig)))
        return start

    merged = merge_kfac_layers(payloads, fed.dims, "size", measure, torch.device("cpu"))
    return [
        {
            "layer": name,
            "lambda_max": lam,
            "sqrt_n": root,
            "ratio": lam / root,
            "damping_over_a": over_a,
            "damping_over_g": over_g,
        }
        for name, (lam, root, over_a, over_g) in zip(kfac_layers(merged), found, strict=True)
    ]


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/authors-fedlpa.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/merging.md")
    spec = yaml.safe_load(path.read_text())
    base = {k: v for k, v in spec["base"].items() if k not in ("plugins", "methods")}
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for point in points(spec):
        cfg = make_config({**base, **point})
        fed = Federation.prepare(federation_plan(cfg))
        for scaling in SCALINGS:
            for row in layer_rows(fed, cfg.clients, scaling):
                rows.append({**point, "scaling": scaling, **row})
                print(
                    ", ".join(
                        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in rows[-1].items()
                    )
                )
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    lines = [
        "| layer | √N | λ_max(T), `scaling=kfc` | ratio | λ_max(T), `scaling=kfac_pytorch` "
        "| ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for layer in layers:
        cells = [f"`{layer}`", f"{next(r['sqrt_n'] for r in rows if r['layer'] == layer):.1f}"]
        for scaling in SCALINGS:
            mine = [r for r in rows if r["layer"] == layer and r["scaling"] == scaling]
            lam = [r["lambda_max"] for r in mine]
            ratio = [r["ratio"] for r in mine]
            cells += [f"{min(lam):.3g} – {max(lam):.3g}", f"{statistics.mean(ratio):.3g}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| layer | γ / mean eig(A), `kfc` | γ / mean eig(G), `kfc` "
        "| γ / mean eig(A), `kfac_pytorch` | γ / mean eig(G), `kfac_pytorch` |",
        "|---|---:|---:|---:|---:|",
    ]
    for layer in layers:
        cells = [f"`{layer}`"]
        for scaling in SCALINGS:
            mine = [r for r in rows if r["layer"] == layer and r["scaling"] == scaling]
            for key in ("damping_over_a", "damping_over_g"):
                cells.append(f"{statistics.mean(r[key] for r in mine):.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    command = f"python scripts/fedlpa_stability.py {path}"
    name = {**spec, "name": "fedlpa-stability"}
    over = (
        f"λ_max: the range; ratio and γ over a factor's mean eigenvalue (tr F / d, the mean over"
        f" the clients): the mean over the {len(points(spec))} federations"
    )
    gamma = FedLPA().config.damping
    over = f"{over} (α × seeds; damping γ = √(1 − coor) = {gamma:.3f})"
    publish(name, command, rows, start, lines, markdown, over, "stability.json")


if __name__ == "__main__":
    main(sys.argv)
