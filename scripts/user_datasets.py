"""Every registered method on the four "bring your own data" datasets of issue 36.

The datasets are scripts/make_user_datasets.py's (written into ``--data``): the breast-cancer
table as a CSV file, a ``make_classification`` table as an npz, a 32×32 RGB image folder and a
20×28 grey npz. For each, the methods whose declared needs the data meets (an image-only
method is left out of a table's run, with the sentence the library refuses it with) run in one
federation as a user would run them: 5 clients, Dirichlet 0.5, a 200-example public pool carved
from train, 10% of each client's data as its validation split, ``mlp`` clients on tables and
``cnn`` on images (the server model the same), the SimCLR encoder on images and the identity
encoder on tables (FedAGE and the head methods), the library's default budgets with the
robustness matrix's cuts of the costliest methods (the data-free synthesisers run 10 of their
30 rounds, F-DAFL 200 of 600 iterations; FedOV/FedEOV attack with 3 FGSM steps of the same
reach; ``fedavg_rounds`` 3 rounds).

Each run writes benchmarks/results/user-datasets/NAME/ (result.json and its CSVs); ``--summary``
writes summary.csv and summary.md there, and splices the tables into
docs/benchmarks/robustness.md: per dataset and method, whether it ran (and whether it
ended at chance, the run's own warning), failed after training started (with its one-line
reason) or was refused before training (and why).

Usage: python scripts/user_datasets.py [--data runs/data/user] [--only NAME,...]
       python scripts/user_datasets.py --summary
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import oneshotfl
from oneshotfl.data import load_dataset
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods.base import METHODS, build_method
from oneshotfl.runner.checks import image_problems
from oneshotfl.runner.report import splice_markdown

OUT = Path("benchmarks/results/user-datasets")
PERSONAL = "local, personal"
PAGE = "docs/benchmarks/robustness.md"

# name -> (dataset spec relative to --data, client model, encoder)
DATASETS: dict[str, tuple[str, str, str]] = {
    "breast-cancer-csv": ("csv:path={data}/breast_cancer.csv", "mlp", "identity"),
    "classification-npz": ("npz:path={data}/classification.npz", "mlp", "identity"),
    "gratings32-folder": ("folder:path={data}/gratings32:size=32:channels=3", "cnn", "simclr"),
    "grey20x28-npz": ("npz:path={data}/grey20x28.npz", "cnn", "simclr"),
}

# the robustness matrix's cuts (benchmarks/robustness-full.yaml); every other method: defaults
CUTS = {
    "dense": "dense:rounds=10",
    "co_boosting": "co_boosting:rounds=10",
    "intactofl": "intactofl:rounds=10",
    "f_dafl": "f_dafl:rounds=200",
    "fedov": "fedov:fgsm_step=0.01:fgsm_steps=3",
    "fedeov": "fedeov:fgsm_step=0.01:fgsm_steps=3",
    "fedeov_pruned": "fedeov_pruned:fgsm_step=0.01:fgsm_steps=3",
    "fedeov_distilled": "fedeov_distilled:fgsm_step=0.01:fgsm_steps=3",
    "fedavg_rounds": "fedavg_rounds:rounds=3",
}


def split(spec: str) -> tuple[list[str], dict[str, str]]:
    """The method specs the dataset's inputs meet, and the refusal sentence of each other."""
    data = load_dataset(spec)
    task = TaskInfo(spec, data.num_classes, data.in_channels, data.image_size)
    taken: list[str] = []
    refused: dict[str, str] = {}
    for name in METHODS.names():
        problems = image_problems([(name, build_method(name))], task)
        if problems:
            refused[name] = problems[0]
        else:
            taken.append(CUTS.get(name, name))
    return taken, refused


def run_one(name: str, data: Path) -> None:
    template, model, encoder = DATASETS[name]
    out = OUT / name
    if (out / "result.json").exists():
        print(f"{name}: done already ({out}/result.json)")
        return
    spec = template.format(data=data)
    methods, refused = split(spec)
    result = oneshotfl.run(
        out=out,
        dataset=spec,
        model=model,
        server_model=model,
        encoder=encoder,
        clients=5,
        public_size=200,
        val_fraction=0.1,
        methods=methods,
        tracker=None,
    )
    (out / "refused.json").write_text(json.dumps(refused, indent=1, sort_keys=True) + "\n")
    print(f"{name}: {len(result.keys)} methods ran, {len(result.failed_methods)} failed")


def summary() -> None:
    rows: list[dict[str, Any]] = []
    for name in DATASETS:
        doc = json.loads((OUT / name / "result.json").read_text())
        refused = json.loads((OUT / name / "refused.json").read_text())
        for m in doc["methods"]:
            key = m["key"]
            acc = m["personal_accuracy"] if "topology" in m else m["accuracy"]  # as the run warns
            acc = None if acc is None else round(100 * acc, 2)
            chance = acc is not None and acc < 150 / doc["data"]["num_classes"]
            status = "ran, at chance" if chance else "ran"
            base = key.split(":")[0]
            rows.append(
                {"dataset": name, "method": base, "spec": key, "status": status, "accuracy": acc}
            )
            if key == "local":  # beside the server-free methods' personal accuracy
                own = round(100 * m["personal_accuracy"], 2)
                rows.append({"dataset": name, "method": PERSONAL, "spec": key,
                             "status": "ran", "accuracy": own})  # fmt: skip
        for key, why in (doc.get("failed_methods") or {}).items():
            rows.append({"dataset": name, "method": key, "status": "failed", "reason": why})
        for key, why in refused.items():
            rows.append({"dataset": name, "method": key, "status": "refused", "reason": why})
    fields = ["dataset", "method", "spec", "status", "accuracy", "reason"]
    with (OUT / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    env = json.loads((OUT / next(iter(DATASETS)) / "result.json").read_text())["environment"]
    lines = [
        f"Recorded on {env['cpu']} ({env['cpu_id']}), torch {env['torch']}, {env['threads']}"
        " thread(s) per run; test accuracy in % (personal accuracy for the server-free"
        " methods: FOL and the neighbourhood ensemble; `local, personal` is each client's own"
        " model on its own label distribution, to compare them with). Cut budgets: "
        + ", ".join(f"`{spec}`" for spec in CUTS.values())
        + ".",
        "",
        "| dataset | ran | of which at chance (below 1.5 / classes) | failed after training started"
        " | refused before training |",
        "|---|---|---|---|---|",
    ]
    for name in DATASETS:
        mine = [r for r in rows if r["dataset"] == name]
        ran = [
            r for r in mine if r["status"].startswith("ran") and r["method"] != "local, personal"
        ]
        chance = ", ".join(r["method"] for r in ran if r["status"] == "ran, at chance") or "none"
        failed = [f"{r['method']} ({r['reason']})" for r in mine if r["status"] == "failed"]
        refused = sorted(r["method"] for r in mine if r["status"] == "refused")
        failed_cell = "; ".join(failed) or "none"
        refused_cell = ", ".join(refused) or "none"
        lines.append(f"| {name} | {len(ran)} | {chance} | {failed_cell} | {refused_cell} |")
    methods = sorted({r["method"] for r in rows})
    lines += ["", "| method | " + " | ".join(DATASETS) + " |", "|---" * (len(DATASETS) + 1) + "|"]
    for key in methods:
        cells = []
        for name in DATASETS:
            hit = [r for r in rows if r["dataset"] == name and r["method"] == key]
            status = hit[0]["status"] if hit else "—"
            ran = status.startswith("ran")
            cells.append(f"{hit[0]['accuracy']:.2f}" if ran else status)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    splice_markdown(Path(PAGE), "user-datasets", "\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("runs/data/user"))
    parser.add_argument("--only", default=",".join(DATASETS))
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        summary()
        return
    for name in args.only.split(","):
        run_one(name, args.data)


if __name__ == "__main__":
    main()
