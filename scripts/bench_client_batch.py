"""Client training alone, one client at a time against ``client_batch`` clients together
(issue 41; docs/benchmarks/scale.md, section ``client-batch``).

1,000 Fashion-MNIST clients (``dirichlet_client``, α = 0.5, 60 images each), the plain recipe
for 5 epochs (no step floor), each model small (``cnn``: LeNet; ``mlp``). It times the
sequential loop (:func:`oneshotfl.training.recipe.train_recipe` per client) and
:func:`oneshotfl.training.vectorised.train_together` at each ``client_batch``, on the device
given, at one torch thread, and checks the two give the same test accuracy (the mean over
clients, within a point). Writes ``benchmarks/results/scale/client-batch-<device>.json`` and
splices the table of every recorded device into the page.

Usage: ``python scripts/bench_client_batch.py [cpu|cuda] [--clients N] [--epochs E]``
(``--table-only``: splice the table of the files recorded, e.g. one brought back from a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from oneshotfl.environment import kernel_signature
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import federation_plan
from oneshotfl.runner.report import splice_markdown
from oneshotfl.training.loop import accuracy, predict_logits
from oneshotfl.training.recipe import train_recipe
from oneshotfl.training.vectorised import Job, train_together

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks/results/scale"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(arch: str, device: torch.device, clients: int, epochs: int) -> dict[str, Any]:
    """Sequential and stacked training of every client: seconds and mean test accuracy."""
    cfg = make_config({"dataset": "fashion_mnist", "partition": "dirichlet_client", "alpha": 0.5,
                       "min_samples": 1, "clients": clients, "model": arch,
                       "local_epochs": epochs, "local_steps": 0, "cache_dir": None,
                       "device": str(device), "methods": ["fedavg"]})  # fmt: skip
    fed = Federation.prepare(federation_plan(cfg))
    contexts = [fed.client_context(c) for c in range(clients)]
    test = fed.data.test
    probe = (test.x[:2000], test.y[:2000])

    def score(models: list[torch.nn.Module]) -> float:
        accs = [accuracy(predict_logits(m, probe[0], device), probe[1]) for m in models[:100]]
        return float(sum(accs) / len(accs))

    _sync(device)
    start = time.perf_counter()
    alone = [
        train_recipe(
            c.recipe(), c.data, c.task, seed=c.seed, client_id=c.client_id, device=device
        ).model
        for c in contexts
    ]
    _sync(device)
    rows: dict[str, Any] = {"1": {"seconds": time.perf_counter() - start, "accuracy": score(alone)}}
    jobs = [Job(c.client_id, c.recipe(), c.data) for c in contexts]
    for batch in (64, 256):
        _sync(device)
        start = time.perf_counter()
        done = train_together(jobs, fed.data.task, seed=cfg.seed, device=device, client_batch=batch)
        _sync(device)
        seconds = time.perf_counter() - start
        models = [done[c.client_id] for c in contexts]
        trained = [m.model for m in models if not isinstance(m, str)]
        rows[str(batch)] = {
            "seconds": seconds,
            "accuracy": score(trained),
            "failed": clients - len(trained),
        }
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--table-only", action="store_true", help="splice the recorded files")
    args = parser.parse_args(argv)
    if args.table_only:
        splice_markdown(ROOT / "docs/benchmarks/scale.md", "client-batch", table())
        return
    torch.set_num_threads(1)
    device = torch.device(args.device)
    record = {
        "clients": args.clients,
        "epochs": args.epochs,
        "environment": kernel_signature(str(device)),
        "archs": {
            arch: measure(arch, device, args.clients, args.epochs) for arch in ("cnn", "mlp")
        },
    }
    name = "cpu" if device.type == "cpu" else "cuda"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"client-batch-{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["archs"], indent=2))
    splice_markdown(ROOT / "docs/benchmarks/scale.md", "client-batch", table())


def table() -> str:
    """Every recorded device's timings as one markdown table."""
    lines = [
        "| device | model | clients × epochs | one at a time s | 64 together s "
        "| 256 together s | speed-up (256) | mean accuracy (1 / 64 / 256) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for path in sorted(OUT.glob("client-batch-*.json")):
        rec = json.loads(path.read_text())
        env = rec["environment"]
        where = env.get("gpu") or env.get("cpu")
        for arch, rows in rec["archs"].items():
            s = {k: rows[k]["seconds"] for k in ("1", "64", "256")}
            a = " / ".join(f"{100 * rows[k]['accuracy']:.1f}" for k in ("1", "64", "256"))
            lines.append(
                f"| {where} | {arch} | {rec['clients']:,} × {rec['epochs']} | {s['1']:.1f} | "
                f"{s['64']:.1f} | {s['256']:.1f} | {s['1'] / s['256']:.2f}× | {a} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
