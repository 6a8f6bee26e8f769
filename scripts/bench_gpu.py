"""What a GPU pays (issue 34): the demo on this machine's CPUs and on its GPU, side by side, and
a 100-client Fashion-MNIST federation of every seed system on the GPU.

Every run starts from an empty artefact cache (every client and encoder trains) on an
otherwise idle machine:

1. ``configs/demo.yaml`` on the CPU (``--device cpu``, the default worker pool);
2. the same on the GPU, one process;
3. the same on the GPU with ``--workers 4``: four clients' updates in flight on it (the
   result must equal run 2's: ``oneshotfl compare``);
4. ``benchmarks/gpu-100clients.yaml`` (the demo's methods, 100 clients, all of
   Fashion-MNIST) on the GPU with the faster of runs 2 and 3's worker counts.

Writes ``benchmarks/results/gpu/<gpu>.json`` (wall times, the CPU/GPU ratio, the targets: ≥ 4×
and 100 clients under 120 s, and where it ran) and prints it. Exit status 2 when torch sees no
CUDA device (nothing is measured, nothing written), 1 when runs 2 and 3 differ.

Usage: ``python scripts/bench_gpu.py`` (``make bench-gpu``).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from helpers import run_config
from oneshotfl.api import resolve_config
from oneshotfl.environment import kernel_signature
from oneshotfl.runner.compare import result_differences

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
HUNDRED = ROOT / "benchmarks" / "gpu-100clients.yaml"
OUT = ROOT / "benchmarks" / "results" / "gpu"


def timed(config: Path, **overrides: Any) -> tuple[float, dict[str, Any]]:
    """Wall seconds and result document of ``config`` from an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        cfg = resolve_config(config, cache_dir=cache, **overrides)
        start = time.perf_counter()
        doc = run_config(cfg)
        return time.perf_counter() - start, doc


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA device; nothing measured", file=sys.stderr)
        return 2
    cpu_s, cpu_doc = timed(DEMO, device="cpu")
    gpu_s, gpu_doc = timed(DEMO, device="cuda", workers=1)
    flight_s, flight_doc = timed(DEMO, device="cuda", workers=4)
    differences = result_differences(gpu_doc, flight_doc, ("1 process", "4 processes"))
    workers = 4 if flight_s < gpu_s else 1
    hundred_s, hundred_doc = timed(HUNDRED, device="cuda", workers=workers)
    signature = kernel_signature("cuda")
    record = {
        "command": "python scripts/bench_gpu.py",
        "where": {**signature, "cores": torch.get_num_threads(), "torch_cuda": torch.version.cuda},
        "demo_wall_s": {
            "cpu": round(cpu_s, 1),
            "gpu_1_process": round(gpu_s, 1),
            "gpu_4_processes": round(flight_s, 1),
        },
        "demo_speedup_gpu_over_cpu": round(cpu_s / min(gpu_s, flight_s), 2),
        "demo_target_speedup": 4.0,
        "in_flight_identical": not differences,
        "differences": differences[:10],
        "hundred_clients_wall_s": round(hundred_s, 1),
        "hundred_clients_workers": workers,
        "hundred_clients_target_s": 120,
        "accuracy": {
            "demo_cpu": {m["key"]: m["accuracy"] for m in cpu_doc["methods"]},
            "demo_gpu": {m["key"]: m["accuracy"] for m in gpu_doc["methods"]},
            "hundred_clients": {m["key"]: m["accuracy"] for m in hundred_doc["methods"]},
        },
    }
    OUT.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", str(signature.get("gpu", "gpu")).lower()).strip("-")
    path = OUT / f"{slug}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"bench_gpu: wrote {path}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
