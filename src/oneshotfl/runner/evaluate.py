"""Evaluation of outcomes on the held-out test split (the final model, never a best epoch).

For every outcome: ``accuracy`` on the global test set and ``personal_accuracy`` — a client's
accuracy on its own test distribution, i.e. the per-class test accuracy re-weighted to the
client's training label distribution, averaged over clients (a global model's is also listed
per client, ``client_personal_accuracy``). Personalised outcomes (``local``,
and every peer method, whose receivers each build their own model) are evaluated per client
with :func:`client_metrics` — on the client itself in a peer run, so a Flower node computes
exactly what the simulation does — and summarised by :func:`summarise_clients`: ``accuracy``
is the mean over clients, ``accuracy_best`` / ``accuracy_worst`` the extremes (the best is an
oracle pick reported for comparison, never used for selection).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from oneshotfl.data.types import LabelledData
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome, Personalised
from oneshotfl.training.loop import many_logits


@dataclass(frozen=True)
class ClientMetrics:
    """One client's model on the test split: global accuracy and accuracy on the client's own
    test distribution."""

    accuracy: float
    personal_accuracy: float


def per_class_accuracy(probs: torch.Tensor, y: torch.Tensor, num_classes: int) -> np.ndarray:
    """Accuracy on each class's test examples (NaN for an absent class)."""
    correct = (probs.argmax(dim=1) == y).double()
    totals = torch.bincount(y, minlength=num_classes).double()
    hits = torch.bincount(y, weights=correct, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (hits / totals).numpy()


def label_weighted(class_acc: np.ndarray, histogram: np.ndarray) -> float:
    """Σ_c p_c acc_c with p the client's label distribution (classes absent from test skipped)."""
    mask = ~np.isnan(class_acc) & (histogram > 0)
    if not mask.any():
        return float("nan")
    p = histogram[mask] / histogram[mask].sum()
    return float((p * class_acc[mask]).sum())


def _nanmean(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    known = [v for v in values if not np.isnan(v)]
    return float(np.mean(known)) if known else float("nan")


def label_histogram(y: torch.Tensor, num_classes: int) -> np.ndarray:
    """A client's ``[classes]`` training-label counts."""
    return np.bincount(y.numpy(), minlength=num_classes)


def client_metrics(probs: torch.Tensor, test: LabelledData, histogram: np.ndarray) -> ClientMetrics:
    """Test accuracy of one client's predictions, globally and on its own distribution."""
    class_acc = per_class_accuracy(probs, test.y, len(histogram))
    return ClientMetrics(
        float((probs.argmax(1) == test.y).double().mean()), label_weighted(class_acc, histogram)
    )


def receiver_metrics(
    outcome: Outcome, test: LabelledData, histogram: np.ndarray, device: torch.device
) -> ClientMetrics:
    """A peer receiver's own model (a :class:`GlobalModel` or :class:`Ensemble`) evaluated
    for that client."""
    if not isinstance(outcome, GlobalModel | Ensemble):
        raise TypeError(
            f"a peer receiver must build a GlobalModel or an Ensemble, got {type(outcome).__name__}"
        )
    return client_metrics(outcome.predict_proba(test.x, device), test, histogram)


def summarise_clients(metrics: Sequence[ClientMetrics]) -> dict[str, Any]:
    """Mean, best and worst accuracy over clients, and the mean personal accuracy."""
    if not metrics:
        raise ValueError("summarise_clients: expected at least one client's metrics, got none")
    accs = [m.accuracy for m in metrics]
    personal = [m.personal_accuracy for m in metrics]
    return {
        "accuracy": float(np.mean(accs)),
        "accuracy_best": float(np.max(accs)),
        "accuracy_worst": float(np.min(accs)),
        "personal_accuracy": _nanmean(personal),
        "client_accuracy": accs,
        "client_personal_accuracy": [None if np.isnan(p) else p for p in personal],
    }


def inference_cost(outcome: Outcome, x: torch.Tensor, device: torch.device) -> dict[str, float]:
    """What the final model costs to use: its ``parameters`` (every member of an ensemble
    and its learned aggregator, experts and gate of a mixture) and the forward
    ``flops_per_image`` of one prediction (``FlopCounterMode``'s count of ``predict_proba``
    on the first image of ``x``). Empty for personalised outcomes, whose models differ per
    client."""
    if not isinstance(outcome, GlobalModel | Ensemble):
        return {}
    modules = [outcome.model] if isinstance(outcome, GlobalModel) else list(outcome.members)
    if isinstance(outcome, Ensemble) and outcome.aggregator is not None:
        modules.append(outcome.aggregator)
    parameters = sum(p.numel() for m in modules for p in m.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        outcome.predict_proba(x[:1], device)
    return {"parameters": float(parameters), "flops_per_image": float(counter.get_total_flops())}


def evaluate_outcome(
    outcome: Outcome,
    test: LabelledData,
    histograms: np.ndarray,
    device: torch.device,
    stacked: bool = False,
) -> dict[str, Any]:
    """Metrics of an outcome; ``histograms`` is the ``[clients, classes]`` label count matrix
    (a NaN row: a client whose counts are not known; its personal accuracy is ``None``).
    ``stacked``: on a GPU, an ensemble's members and a personalised outcome's models of one
    architecture are evaluated in shared vectorised passes (``client_batch > 1``); on a CPU
    they run one at a time in channels-last layout (:func:`many_logits`)."""
    num_classes = histograms.shape[1]
    if isinstance(outcome, Personalised):
        ids = sorted(outcome.models)
        each = many_logits([outcome.models[c] for c in ids], test.x, device, stack=stacked)
        return summarise_clients(
            [
                client_metrics(torch.softmax(out, dim=-1), test, histograms[cid])
                for cid, out in zip(ids, each, strict=True)
            ]
        )
    if isinstance(outcome, GlobalModel | Ensemble):
        if isinstance(outcome, Ensemble):  # on a GPU with `stacked`: in shared passes
            assert outcome.weights is not None
            members = many_logits(outcome.members, test.x, device, stack=stacked)
            probs = outcome.combine(torch.stack(members), outcome.weights)
        else:
            probs = outcome.predict_proba(test.x, device)
        class_acc = per_class_accuracy(probs, test.y, num_classes)
        personal = [label_weighted(class_acc, h) for h in histograms]  # NaN: no histogram
        return {
            "accuracy": float((probs.argmax(1) == test.y).double().mean()),
            "personal_accuracy": _nanmean(personal),
            "client_personal_accuracy": [None if np.isnan(p) else float(p) for p in personal],
            "per_class_accuracy": [float(a) for a in class_acc],
        }
    raise TypeError(f"expected a GlobalModel, Ensemble or Personalised outcome, got {outcome!r}")
