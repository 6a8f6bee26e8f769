"""An ensemble's evaluation against its members' forward passes alone (issue 53, item 3;
docs/benchmarks/scale.md, section ``ensemble-eval``).

For each case (an architecture, a number of members, a slice of the Fashion-MNIST test split)
it builds the members (drawn from one seed each: the time of a forward pass does not depend
on the weights) and times, in this one process at one thread:

- ``reference``: the members' forward passes alone, one model at a time in chunks of 1,024
  images as PyTorch runs them by default (``model(chunk)`` under ``no_grad``) — what
  evaluating an ensemble cost before this item, and the yardstick of its target (≤ 2×);
- ``channels_last``: the same passes with each member's convolution weights in channels-last
  layout (:func:`~oneshotfl.models.stacked.channels_last_weights`), the kernels evaluation
  uses on a CPU: what is left of the evaluation's time above it is its bookkeeping;
- ``evaluation``: :func:`oneshotfl.runner.evaluate.evaluate_outcome` of the
  :class:`~oneshotfl.protocol.outcome.Ensemble` outcome (the members' logits, their combined
  probabilities, accuracy, per-class and personal accuracies) as a run evaluates it now;
- ``stacked`` (convolutional models): a subset of the members stacked along a model axis in
  one vectorised pass (:func:`torch.func.vmap` over ``functional_call``: grouped
  convolutions), at 1,024 and 4,096 images a pass — what a GPU run with ``client_batch`` does.

Each time is the best of ``--repeats`` (reported per member and image too), and the
evaluation's logits are checked against the reference's: the largest difference and the share
of images whose predicted class agrees, member by member. Writes
``benchmarks/results/ensemble-eval/summary.json`` and splices its table into the page.

Usage: ``python scripts/bench_ensemble_eval.py [--quick] [--repeats R]`` (``--quick``: a few
members over a few hundred images, to check the script; not spliced). Run it on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from oneshotfl.data.datasets import load_dataset
from oneshotfl.environment import kernel_signature
from oneshotfl.models.base import create_model
from oneshotfl.models.stacked import _group, channels_last_weights
from oneshotfl.protocol.outcome import Ensemble
from oneshotfl.runner.evaluate import evaluate_outcome
from oneshotfl.runner.report import splice_markdown

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks/results/ensemble-eval"
DOC = ROOT / "docs/benchmarks/scale.md"
CPU = torch.device("cpu")
CASES: list[dict[str, Any]] = [  # arch, members, test images, members stacked
    {"arch": "cnn", "members": 100, "images": 10_000, "stacked": 16},
    {"arch": "simple_cnn2", "members": 10, "images": 10_000, "stacked": 10},
    {"arch": "fedavg_cnn", "members": 10, "images": 2_000, "stacked": 10},
    {"arch": "resnet8", "members": 10, "images": 1_000, "stacked": 10},
    {"arch": "mlp", "members": 100, "images": 10_000, "stacked": 0},
]
QUICK: list[dict[str, Any]] = [
    {"arch": "cnn", "members": 3, "images": 300, "stacked": 3},
    {"arch": "mlp", "members": 3, "images": 300, "stacked": 0},
]


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The shortest of ``repeats`` timed calls, and the last call's answer."""
    best, answer = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        answer = fn()
        best = min(best, time.perf_counter() - start)
    return best, answer


@torch.no_grad()
def reference(members: list[torch.nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """Each member's logits, one at a time, in PyTorch's default layout."""
    return [torch.cat([m(c) for c in x.split(1024)]) for m in members]


@torch.no_grad()
def channels_last(members: list[torch.nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """Each member's logits, one at a time, with its convolutions in channels-last layout."""
    out = []
    for m in members:
        state = channels_last_weights(m)
        out.append(torch.cat([functional_call(m, state, (c,)) for c in x.split(1024)]))
    return out


def measure(case: dict[str, Any], x: torch.Tensor, y: torch.Tensor, repeats: int) -> dict[str, Any]:
    """One case's times (seconds, best of ``repeats``) and the evaluation's agreement."""
    arch, n = case["arch"], case["members"]
    x, y = x[: case["images"]], y[: case["images"]]
    members: list[torch.nn.Module] = []
    for seed in range(n):
        torch.manual_seed(seed)
        members.append(create_model(arch, x.shape[1], 10, x.shape[-1]).eval())
    test = _Test(x, y)
    histograms = np.ones((n, 10))
    ref_s, ref = best_of(repeats, lambda: reference(members, x))
    cl_s, _ = best_of(repeats, lambda: channels_last(members, x))
    ensemble = Ensemble(members)
    eval_s, metrics = best_of(
        repeats,
        lambda: evaluate_outcome(ensemble, test, histograms, CPU),  # type: ignore[arg-type]
    )
    now = ensemble.predict_proba(x, CPU)  # the memo is off here: computed again
    want = ensemble.combine(torch.stack(ref), ensemble.weights)  # type: ignore[arg-type]
    row: dict[str, Any] = {
        **case,
        "reference_s": round(ref_s, 3),
        "evaluation_s": round(eval_s, 3),
        "channels_last_s": round(cl_s, 3),
        "evaluation_over_reference": round(eval_s / ref_s, 3),
        "evaluation_over_channels_last": round(eval_s / cl_s, 3),
        "max_abs_probability_difference": float((now - want).abs().max()),
        "same_prediction": float((now.argmax(1) == want.argmax(1)).double().mean()),
        "accuracy": metrics["accuracy"],
    }
    if case["stacked"]:
        some = members[: case["stacked"]]
        share = len(some) / n
        for batch in (1024, 4096):
            stacked_s, _ = best_of(repeats, functools.partial(_group, some, x, CPU, batch))
            row[f"stacked_{batch}_over_reference"] = round(stacked_s / (ref_s * share), 3)
    per = 1e6 / (n * len(x))
    row["reference_us_per_member_image"] = round(ref_s * per, 1)
    row["channels_last_us_per_member_image"] = round(cl_s * per, 1)
    row["evaluation_us_per_member_image"] = round(eval_s * per, 1)
    return row


class _Test:
    """The slice of the test split :func:`evaluate_outcome` reads (``x``, ``y``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)


def table(doc: dict[str, Any]) -> str:
    """The page's table of ``summary.json``."""
    lines = [
        "| model | members | test images | members alone s | channels-last alone s | "
        "evaluation s | evaluation / members alone | evaluation / channels-last alone | µs a "
        "member-image (alone → evaluation) | stacked / alone (1,024; 4,096 images a pass) | "
        "same prediction |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in doc["rows"]:
        stacked = (
            f"{r['stacked_1024_over_reference']:.2f}×; {r['stacked_4096_over_reference']:.2f}× "
            f"({r['stacked']} members)"
            if r.get("stacked")
            else "—"
        )
        lines.append(
            f"| {r['arch']} | {r['members']} | {r['images']:,} | {r['reference_s']:g} | "
            f"{r['channels_last_s']:g} | {r['evaluation_s']:g} | "
            f"{r['evaluation_over_reference']:.2f}× | {r['evaluation_over_channels_last']:.2f}× | "
            f"{r['reference_us_per_member_image']:g} → {r['evaluation_us_per_member_image']:g} | "
            f"{stacked} | {100 * r['same_prediction']:.2f}% |"
        )
    env = doc["environment"]
    lines += [
        "",
        f"Measured on {env['cpu']}, torch {env['torch']}, {env['threads']} thread(s), best of "
        f"{doc['repeats']}.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few members and images")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per figure")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: expected at least 1, got {args.repeats}")
    torch.set_num_threads(1)
    test = load_dataset("fashion_mnist").test
    rows = []
    for case in QUICK if args.quick else CASES:
        rows.append(measure(case, test.x, test.y, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    doc = {"rows": rows, "repeats": args.repeats, "environment": kernel_signature("cpu")}
    if args.quick:
        print(table(doc))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    splice_markdown(DOC, "ensemble-eval", table(doc))


if __name__ == "__main__":
    main(sys.argv[1:])
