"""What a message of distilled data reveals — FedD3's examples, FedSD2C's distillates (its
latents decoded by the shared autoencoder, as the server decodes them) — against the sending
client's data.

For each client and variant of the spec (``benchmarks/fedd3-privacy.yaml``,
``benchmarks/fedsd2c-privacy.yaml``) the client step runs as in a run (cached with it), and
its examples x̂ are compared, on [0, 1] pixels, with the client's training images (members)
and test images of the same labels (non-members):

* ``psnr_member`` / ``psnr_non_member``: the mean over x̂ of the PSNR to the closest of all the
  client's training images / of as many label-matched test images as the test set holds (a
  near-copy of a training image is ≥ 30 dB; 100 dB caps an exact copy);
* ``copies``: the share of x̂ within 30 dB of some training image;
* ``auc``: the ROC AUC of the nearest-example membership attack on ``candidates`` random
  training images and as many label-matched test images — a candidate scores the negative
  distance to its closest x̂ (0.5: the message says nothing of who was in the data);
* FedSD2C only, ``psnr_own_crop``: the mean PSNR of each decoded distillate to the crop of a
  training image it was made from (its core-set crop, recomputed as the client made it) — a
  distillate is a crop, often a zoomed part of an image, which the whole-image measures above
  would not call a copy.

Writes ``benchmarks/results/NAME/privacy.json`` and splices the table between the
``<!-- report:NAME -->`` markers of ``docs/benchmarks/merging.md``.

Usage: python scripts/fedd3_privacy.py [benchmarks/fedd3-privacy.yaml] [MARKDOWN]
(a spec naming a method that sends neither examples nor latents stops with one line)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from oneshotfl.methods import build_method
from oneshotfl.methods.fedsd2c import PREFIX, FedSd2c, core_set
from oneshotfl.models.base import ClassifierModel
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import federation_plan
from oneshotfl.runner.report import splice_markdown
from oneshotfl.security.inversion import psnr, to_unit_range
from oneshotfl.security.membership import label_matched, roc_auc
from oneshotfl.training.services import train_model

COPY_DB = 30.0


def closest_psnr(sent: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """For each row of ``sent``, the PSNR to its closest row of ``pool``."""
    distances = torch.cdist(sent.flatten(1).double(), pool.flatten(1).double())
    nearest = pool[distances.argmin(1)]
    return psnr(sent, nearest)


def audit(
    sent: torch.Tensor,
    pools: tuple[torch.Tensor, torch.Tensor],
    members: torch.Tensor,
    others: torch.Tensor,
) -> dict[str, float]:
    """The module docs' measures: ``pools`` = (all training images, label-matched test
    images), ``members``/``others`` the attack's candidates."""
    to_member, to_other = closest_psnr(sent, pools[0]), closest_psnr(sent, pools[1])
    score_m = -torch.cdist(members.flatten(1).double(), sent.flatten(1).double()).min(1).values
    score_o = -torch.cdist(others.flatten(1).double(), sent.flatten(1).double()).min(1).values
    return {
        "psnr_member": float(to_member.mean()),
        "psnr_non_member": float(to_other.mean()),
        "copies": float((to_member >= COPY_DB).double().mean()),
        "auc": roc_auc(score_m, score_o),
    }


def own_crops(method: FedSd2c, ctx: ClientContext) -> torch.Tensor:
    """The core-set crops FedSD2C's client made its distillates from, in the message's order."""
    model = train_model(ctx, ctx.recipe()).to(ctx.device).eval()
    assert isinstance(model, ClassifierModel)
    with torch.no_grad():
        return core_set(model, ctx.data, method.config, ctx, ctx.device)[0]


def sent_examples(
    key: str, method: Method[Any], payload: Payload, ctx: ClientContext
) -> torch.Tensor:
    """The examples a client's message carries, in the task's normalised space: FedD3's ``x``,
    or FedSD2C's latents decoded by the autoencoder the server holds (the same, by its
    fingerprint)."""
    if "x" in payload.arrays:
        return torch.from_numpy(np.asarray(payload.arrays["x"]))
    if isinstance(method, FedSd2c):
        latents = torch.from_numpy(np.asarray(payload.arrays[f"{PREFIX}.latents"]))
        return method.autoencoder(ctx).decoded(latents, ctx.device)
    raise SystemExit(f"{key}: its message carries neither examples (x) nor latents to audit")


def cell(rows: list[dict[str, Any]], name: str, scale: float = 1.0, digits: int = 1) -> str:
    """mean ± std of ``name`` over ``rows``."""
    values = [scale * r[name] for r in rows]
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.pstdev(values):.{digits}f}"


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/fedd3-privacy.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/merging.md")
    spec = yaml.safe_load(path.read_text())
    cfg = make_config({**spec["base"], "methods": spec["methods"]})
    fed = Federation.prepare(federation_plan(cfg))
    dataset, test = cfg.dataset, fed.data.test
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for key in spec["methods"]:
        method = build_method(key)
        for client in range(cfg.clients):
            ctx = fed.client_context(client)
            rng = np.random.default_rng(client)
            chosen = rng.choice(len(ctx.data), min(spec["candidates"], len(ctx.data)), False)
            members = torch.from_numpy(np.sort(chosen))
            others = label_matched(ctx.data.y[members], test.y, rng, set())
            matched = label_matched(ctx.data.y, test.y, rng, set())
            sent = sent_examples(key, method, method.client_update(ctx), ctx)
            pools = (to_unit_range(ctx.data.x, dataset), to_unit_range(test.x[matched], dataset))
            report = audit(
                to_unit_range(sent, dataset),
                pools,
                to_unit_range(ctx.data.x[members], dataset),
                to_unit_range(test.x[others], dataset),
            )
            if isinstance(method, FedSd2c):
                crops = to_unit_range(own_crops(method, ctx), dataset)
                report["psnr_own_crop"] = float(psnr(to_unit_range(sent, dataset), crops).mean())
            rows.append({"method": key, "client": client, **report})
            print(f"{key} client {client}: " + ", ".join(f"{k} {v:.3f}" for k, v in report.items()))
    lines = [
        "| variant | PSNR to closest member (dB) | to closest non-member (dB) "
        f"| within {COPY_DB:g} dB of a member | nearest-example attack ROC AUC |",
        "|---|---:|---:|---:|---:|",
    ]
    with_crops = all("psnr_own_crop" in r for r in rows)
    if with_crops:
        lines[0] += " to its own core-set crop (dB) |"
        lines[1] += "---:|"
    for key in spec["methods"]:
        mine = [r for r in rows if r["method"] == key]
        lines.append(
            f"| `{key}` | {cell(mine, 'psnr_member')} | {cell(mine, 'psnr_non_member')} "
            f"| {cell(mine, 'copies', 100)}% | {cell(mine, 'auc', digits=3)} |"
            + (f" {cell(mine, 'psnr_own_crop')} |" if with_crops else "")
        )
    command = f"python scripts/fedd3_privacy.py {path}"
    over = f"Mean ± std over the {cfg.clients} clients"
    publish(spec, command, rows, start, lines, markdown, over)


def publish(
    spec: dict[str, Any],
    command: str,
    rows: list[dict[str, Any]],
    start: float,
    lines: list[str],
    markdown: Path,
    over: str,
    filename: str = "privacy.json",
) -> None:
    """Write ``benchmarks/results/<name>/<filename>`` (the spec, the rows, the seconds since
    ``start``) and splice the table ``lines`` into ``markdown``'s markers of that name."""
    out = Path("benchmarks/results") / spec["name"]
    out.mkdir(parents=True, exist_ok=True)
    seconds = time.perf_counter() - start
    document = {
        "command": command,
        "config": spec,
        "seconds": seconds,
        "torch": torch.__version__,
        "rows": rows,
    }
    (out / filename).write_text(json.dumps(document, indent=2) + "\n")
    body = "\n".join(lines) + f"\n\n{over}; {seconds / 60:.1f} min (`{command}`)."
    splice_markdown(markdown, spec["name"], body)
    print(f"{spec['name']} → {out / filename} and {markdown}")


if __name__ == "__main__":
    main(sys.argv)
