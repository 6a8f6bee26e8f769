"""Where FedLPA's gradient descent (the authors' ``newton_solve``) is stable, per layer.

For every grid point and seed of a benchmark (``benchmarks/merging-fmnist.yaml``: the merging
table's clients, seeds 0–2; its ``methods`` and ``plugins`` are not run) and both K-FAC scalings
(``fedlpa:scaling=kfc|kfac_pytorch``), the clients' factors are formed as in a run (cached with
it), damped by FedLPA's γ, and for every layer the largest eigenvalue of the merge's operator
T(M) = Σ_k p_k G̃_k M Ã_k (:func:`~oneshotfl.methods.kfac.kfac_largest_eigenvalue`) is set
against √N, N the layer's entries: the descent at the authors' lr 1 on the *mean* squared
residual converges only while λ_max(T) < √N (``ratio`` < 1). Beside it, how the damping γI
weighs against each factor: γ over the factor's mean eigenvalue (tr F / d, averaged over the
clients), for A and G — the only thing the two scalings change (A/S², G·S² for a convolution
with S output locations leave A ⊗ G as it is). And an ablation of that reading: FedLPA's
default solver on the factors of either scaling as sent and with each convolution's A (or G)
replaced by its mean eigenvalue times I (the trace kept, the correlations dropped), or G
scaled to one trace for every client (the correlations kept): the test accuracy of the merged
model.

Writes ``benchmarks/results/fedlpa-stability/stability.json`` and splices the table between the
``<!-- report:fedlpa-stability -->`` markers of ``docs/benchmarks/merging.md``.

Usage: python scripts/fedlpa_stability.py [benchmarks/merging-fmnist.yaml] [MARKDOWN]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedd3_privacy import publish

from oneshotfl.methods import build_method
from oneshotfl.methods.common import average_models
from oneshotfl.methods.fedlpa import FedLPA
from oneshotfl.methods.kfac import damped, kfac_largest_eigenvalue, merge_kfac_layers
from oneshotfl.payload import Payload
from oneshotfl.protocol.layer_stats import kfac_layers
from oneshotfl.protocol.outcome import GlobalModel
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import federation_plan
from oneshotfl.runner.sweep import parse_sweep
from oneshotfl.training.loop import accuracy

SCALINGS = ("kfc", "kfac_pytorch")
ABLATIONS = {  # name → (scaling, (the factor of every convolution changed, how) or None)
    "kfc": ("kfc", None),
    "kfc, convolutions' A isotropic": ("kfc", ("A", "isotropic")),
    "kfc, convolutions' G isotropic": ("kfc", ("G", "isotropic")),
    "kfac_pytorch": ("kfac_pytorch", None),
    "kfac_pytorch, convolutions' A isotropic": ("kfac_pytorch", ("A", "isotropic")),
    "kfac_pytorch, convolutions' G isotropic": ("kfac_pytorch", ("G", "isotropic")),
    "kfac_pytorch, convolutions' G of one scale": ("kfac_pytorch", ("G", "one_scale")),
}


def client_payloads(fed: Federation, clients: int, scaling: str) -> dict[int, Payload]:
    """Every client's FedLPA message in one scaling (cached with the run's)."""
    method = build_method(f"fedlpa:scaling={scaling}")
    return {c: method.client_update(fed.client_context(c)) for c in range(clients)}


def altered(
    payloads: dict[int, Payload], convs: list[str], factor: str, how: str
) -> dict[int, Payload]:
    """The payloads with the ``factor`` (A or G) of every convolution in ``convs`` changed:
    ``isotropic``, replaced by (tr F_k / d)·I (its scale kept, its correlations dropped);
    ``one_scale``, multiplied by the clients' mean tr F / tr F_k (its correlations kept, one
    scale for all)."""
    arrays = {c: dict(p.arrays) for c, p in payloads.items()}
    for name in convs:
        key = f"kfac.{name}.{factor}"
        traces = {c: float(np.trace(arrays[c][key])) for c in arrays}
        mean = sum(traces.values()) / len(traces)
        for c, mine in arrays.items():
            f = mine[key]
            if how == "isotropic":
                mine[key] = (traces[c] / f.shape[0] * np.eye(f.shape[0])).astype(f.dtype)
            else:
                mine[key] = (f * (mean / traces[c])).astype(f.dtype)
    return {c: Payload(arrays[c], p.scalars) for c, p in payloads.items()}


def ablation_rows(fed: Federation, sent: dict[str, dict[int, Payload]]) -> list[dict[str, Any]]:
    """Test accuracy of FedLPA's default merge for every entry of :data:`ABLATIONS`, from the
    clients' messages in each scaling (``sent``)."""
    method, rows = FedLPA(), []
    model = average_models(sent[SCALINGS[0]], fed.dims)
    convs = [n for n, m in kfac_layers(model).items() if isinstance(m, torch.nn.Conv2d)]
    ctx = fed.server_view().server_context(method.requires)
    for name, (scaling, change) in ABLATIONS.items():
        payloads = sent[scaling] if change is None else altered(sent[scaling], convs, *change)
        merged = method.aggregate(payloads, ctx)
        assert isinstance(merged, GlobalModel)
        probs = merged.predict_proba(fed.data.test.x, torch.device("cpu"))
        rows.append({"ablation": name, "accuracy": accuracy(probs, fed.data.test.y)})
    return rows


def layer_rows(fed: Federation, payloads: dict[int, Payload]) -> list[dict[str, Any]]:
    """λ_max(T), √N, their ratio and γ over A's and G's mean eigenvalues, per K-FAC layer."""
    gamma, found = FedLPA().config.damping, []

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


def show(row: dict[str, Any]) -> None:
    print(", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))


def tables(rows: list[dict[str, Any]]) -> list[str]:
    """The three tables: stability and damping per layer, the ablation's accuracy per α."""
    per_layer = [r for r in rows if "layer" in r]
    layers = list(dict.fromkeys(r["layer"] for r in per_layer))

    def mine(layer: str, scaling: str) -> list[dict[str, Any]]:
        return [r for r in per_layer if r["layer"] == layer and r["scaling"] == scaling]

    lines = [
        "| layer | √N | λ_max(T), `scaling=kfc` | ratio | λ_max(T), `scaling=kfac_pytorch` "
        "| ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for layer in layers:
        cells = [f"`{layer}`", f"{mine(layer, SCALINGS[0])[0]['sqrt_n']:.1f}"]
        for scaling in SCALINGS:
            lam = [r["lambda_max"] for r in mine(layer, scaling)]
            ratio = statistics.mean(r["ratio"] for r in mine(layer, scaling))
            cells += [f"{min(lam):.3g} – {max(lam):.3g}", f"{ratio:.3g}"]
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
            for key in ("damping_over_a", "damping_over_g"):
                cells.append(f"{statistics.mean(r[key] for r in mine(layer, scaling)):.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    found = [r for r in rows if "ablation" in r]
    alphas = sorted({r["alpha"] for r in found})
    lines += [
        "",
        "| `fedlpa` (solver `cg`) on | " + " | ".join(f"α = {a}" for a in alphas) + " |",
        "|---|" + "---:|" * len(alphas),
    ]
    for name in ABLATIONS:
        cells = [name]
        for alpha in alphas:
            acc = [
                100 * r["accuracy"] for r in found if r["ablation"] == name and r["alpha"] == alpha
            ]
            cells.append(
                f"{statistics.mean(acc):.2f} (" + " / ".join(f"{a:.2f}" for a in acc) + ")"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/merging-fmnist.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/merging.md")
    spec = yaml.safe_load(path.read_text())
    base = {k: v for k, v in spec["base"].items() if k not in ("plugins", "methods")}
    runs = parse_sweep({**spec, "base": base}).runs
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for run in runs:
        cfg = run.config
        point = {"partition": cfg.partition, "alpha": cfg.alpha, "seed": cfg.seed}
        fed = Federation.prepare(federation_plan(cfg))
        sent = {scaling: client_payloads(fed, cfg.clients, scaling) for scaling in SCALINGS}
        for scaling in SCALINGS:
            for row in layer_rows(fed, sent[scaling]):
                rows.append({**point, "scaling": scaling, **row})
                show(rows[-1])
        for row in ablation_rows(fed, sent):
            rows.append({**point, **row})
            show(rows[-1])
    lines = tables(rows)
    command = f"python scripts/fedlpa_stability.py {path}"
    name = {**spec, "name": "fedlpa-stability"}
    gamma = FedLPA().config.damping
    over = (
        f"λ_max: the range; ratio and γ over a factor's mean eigenvalue (tr F / d, the mean over"
        f" the clients): the mean over the {len(runs)} federations (α × seeds; damping"
        f" γ = √(1 − coor) = {gamma:.3f}); accuracy (%): the mean over the seeds, each seed's in"
        " brackets"
    )
    publish(name, command, rows, start, lines, markdown, over, "stability.json")


if __name__ == "__main__":
    main(sys.argv)
