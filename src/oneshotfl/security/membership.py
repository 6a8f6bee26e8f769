"""Membership-inference audit of what clients upload: does a client's one message tell its
receiver whether a given record was in the client's training data?

For each audited client the candidates are ``candidates`` of its training examples (members)
and as many test examples drawn with the same label histogram (non-members). Matching the
labels matters: under label skew an attack that only looks at the label would otherwise
look strong. The receiver's view of the client's model depends on the upload kind:

* **model** — the uploaded model itself;
* **predictions** — softmax outputs on the public pool: a surrogate of the client's
  architecture distilled from them (``surrogate_epochs``), the best model the receiver can
  rebuild;
* **latents + head** — the uploaded head on the shared encoder's embeddings.

Attacks, each a score per candidate (higher: "member"):

* ``loss`` — the loss threshold of Yeom et al. (CSF 2018): −CE of the view on the candidate;
* ``shadow`` — the shadow models of Shokri et al. (S&P 2017). The attacker runs the method's
  own client step ``shadows`` times on labelled data it holds: half of the test split,
  disjoint from the non-member candidates, drawn with the client's label histogram and size.
  It rebuilds each shadow's view the same way and fits a logistic regression on features of
  the view's outputs (loss, top probability, entropy, true-class probability) to tell the
  shadow's members from its non-members. Then it scores the target;
* ``nearest`` (latent uploads only) — −‖E(x) − z‖ to the closest uploaded latent row.

Reported per attack: the ROC AUC (0.5: the upload says nothing) and the TPR at ``fpr``
(default 1%) false positives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from oneshotfl.data.types import LabelledData
from oneshotfl.functional import kl_to_student
from oneshotfl.methods.common import encoded_head, head_from_payload
from oneshotfl.params import Params, is_int, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method
from oneshotfl.protocol.fields import model_from_fields
from oneshotfl.seeding import numpy_rng, torch_generator
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import predict_logits
from oneshotfl.training.recipe import initial_model

View = Callable[[torch.Tensor], torch.Tensor]
"""Images → the receiver's logits for them."""


@dataclass(frozen=True)
class AuditConfig(Params):
    """Attributes: candidates: members (and as many non-members) per client; shadows: shadow
    runs of the client step; surrogate_epochs: distillation epochs of a prediction upload's
    surrogate; fpr: the false-positive rate the TPR is read at."""

    candidates: int = 500
    shadows: int = 3
    surrogate_epochs: int = 5
    fpr: float = 0.01

    def validate(self) -> None:
        require(is_int(self.candidates, 10), "candidates", "an int >= 10", self.candidates)
        require(is_int(self.shadows, 1), "shadows", "an int >= 1", self.shadows)
        require(is_int(self.surrogate_epochs, 1), "surrogate_epochs", "an int >= 1",
                self.surrogate_epochs)  # fmt: skip
        require(0 < self.fpr < 1, "fpr", "in (0, 1)", self.fpr)


def roc_auc(members: torch.Tensor, others: torch.Tensor) -> float:
    """P(score of a member > score of a non-member), ties counting one half (Mann–Whitney)."""
    diff = members.double()[:, None] - others.double()[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def tpr_at_fpr(members: torch.Tensor, others: torch.Tensor, fpr: float) -> float:
    """The fraction of members scored above the strictest threshold that lets at most ``fpr``
    of the non-members through."""
    allowed = int(np.floor(fpr * len(others)))
    ranked = torch.sort(others.double(), descending=True).values
    threshold = ranked[allowed] if allowed < len(ranked) else ranked[-1] - 1
    return float((members.double() > threshold).double().mean())


def output_features(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per candidate: CE loss, top probability, entropy and log true-class probability."""
    logp = F.log_softmax(logits.double(), -1)
    p = logp.exp()
    true = logp.gather(1, y[:, None]).squeeze(1)
    return torch.stack([-true, p.max(1).values, -(p * logp).sum(1), true], 1).float()


def fit_logistic(x_in: torch.Tensor, x_out: torch.Tensor, steps: int = 200) -> Callable[..., Any]:
    """A logistic regression telling ``x_in`` rows (1) from ``x_out`` rows (0), features
    standardised on their union; returns the scoring function."""
    x = torch.cat([x_in, x_out]).double()
    y = torch.cat([torch.ones(len(x_in)), torch.zeros(len(x_out))]).double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-9)
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(((x - mean) / std) @ w + b, y)
        loss = loss + 1e-4 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w, b = w.detach(), b.detach()
    return lambda feats: ((feats.double() - mean) / std) @ w + b


def upload_kind(payload: Payload) -> str:
    """``latents``, ``predictions`` or ``model``, from the payload's fields."""
    if "latents" in payload.arrays:
        return "latents"
    if "probs" in payload.arrays:
        return "predictions"
    if any(k.startswith("model.") for k in payload.arrays):
        return "model"
    raise ValueError(f"membership audit: expected a model, predictions or latents, got "
                     f"{sorted(payload.arrays)}")  # fmt: skip


def receiver_view(payload: Payload, ctx: ClientContext, cfg: AuditConfig) -> View:
    """The receiver's best model of the client, rebuilt from its upload alone."""
    kind = upload_kind(payload)
    if kind == "model":
        model = model_from_fields(payload, ctx.dims).to(ctx.device).eval()
        classes = ctx.task.num_classes
        return lambda x: predict_logits(model, x, ctx.device)[:, :classes]
    if kind == "latents":
        view = encoded_head(ctx, head_from_payload(payload, ctx.dims)).to(ctx.device)
        return lambda x: predict_logits(view, x, ctx.device)
    if ctx.public is None:
        raise ValueError("membership audit: a prediction upload needs the public pool")
    probs = torch.from_numpy(np.asarray(payload.arrays["probs"], np.float32))
    surrogate = initial_model(ctx.arch, ctx.task, ctx.seed, init=ctx.train_config.init).to(
        ctx.device
    )
    train = dataclasses.replace(ctx.train_config, epochs=cfg.surrogate_epochs, min_steps=0)
    gen = torch_generator(ctx.seed, "membership", "surrogate", ctx.client_id)
    distil(surrogate, ctx.public.x, kl_to_student, train, gen, ctx.device, targets=(probs,))
    return lambda x: predict_logits(surrogate, x, ctx.device)


def label_matched(
    wanted: torch.Tensor, pool_y: torch.Tensor, rng: np.random.Generator, exclude: set[int]
) -> torch.Tensor:
    """Indices into ``pool_y`` (not in ``exclude``) with the label histogram of ``wanted``,
    class by class as far as the pool has them."""
    picked: list[int] = []
    for c in torch.unique(wanted).tolist():
        need = int((wanted == c).sum())
        have = [i for i in torch.nonzero(pool_y == c).flatten().tolist() if i not in exclude]
        picked += rng.choice(have, size=min(need, len(have)), replace=False).tolist()
    return torch.tensor(sorted(picked), dtype=torch.long)


def audit_client(
    method: Method[Any], ctx: ClientContext, test: LabelledData, cfg: AuditConfig
) -> dict[str, float]:
    """AUC and TPR at ``cfg.fpr`` of every attack against one client's upload."""
    rng = numpy_rng(ctx.seed, "membership", ctx.client_id)
    half = torch.from_numpy(rng.permutation(len(test)))
    evaluation, shadow_pool = half[: len(test) // 2], half[len(test) // 2 :]
    members = torch.from_numpy(
        np.sort(rng.choice(len(ctx.data), min(cfg.candidates, len(ctx.data)), replace=False))
    )
    y_members = ctx.data.y[members]
    others = evaluation[label_matched(y_members, test.y[evaluation], rng, set())]
    x_cand = torch.cat([ctx.data.x[members], test.x[others]])
    y_cand = torch.cat([y_members, test.y[others]])
    is_member = torch.cat([torch.ones(len(members)), torch.zeros(len(others))]).bool()

    payload = method.client_update(ctx)
    view = receiver_view(payload, ctx, cfg)
    target = output_features(view(x_cand), y_cand)
    scores = {"loss": -target[:, 0]}

    shadow_in, shadow_out = [], []
    for s in range(cfg.shadows):
        pool_y = test.y[shadow_pool]
        inside = label_matched(ctx.data.y, pool_y, rng, set())
        outside = label_matched(y_members, pool_y, rng, set(inside.tolist()))
        shadow = dataclasses.replace(
            ctx,
            client_id=10_000 + 100 * ctx.client_id + s,  # its own seed streams and cache keys
            data=LabelledData(test.x[shadow_pool[inside]], test.y[shadow_pool[inside]]),
            val=None,
        )
        shadow_view = receiver_view(method.client_update(shadow), shadow, cfg)
        n_in = min(len(inside), len(outside))
        x_in, y_in = shadow.data.x[:n_in], shadow.data.y[:n_in]
        x_out, y_out = test.x[shadow_pool[outside]], test.y[shadow_pool[outside]]
        shadow_in.append(output_features(shadow_view(x_in), y_in))
        shadow_out.append(output_features(shadow_view(x_out), y_out))
    attack = fit_logistic(torch.cat(shadow_in), torch.cat(shadow_out))
    scores["shadow"] = attack(target).float()

    if upload_kind(payload) == "latents" and ctx.encoder is not None:
        latents = torch.from_numpy(np.asarray(payload.arrays["latents"], np.float32))
        embedded = ctx.encoder.embed(x_cand, ctx.device)
        scores["nearest"] = -torch.cdist(embedded, latents).min(1).values

    report: dict[str, float] = {"members": float(len(members)), "non_members": float(len(others))}
    for name, score in scores.items():
        report[f"{name}_auc"] = roc_auc(score[is_member], score[~is_member])
        report[f"{name}_tpr"] = tpr_at_fpr(score[is_member], score[~is_member], cfg.fpr)
    return report


__all__ = [
    "AuditConfig",
    "audit_client",
    "fit_logistic",
    "label_matched",
    "output_features",
    "receiver_view",
    "roc_auc",
    "tpr_at_fpr",
    "upload_kind",
]
