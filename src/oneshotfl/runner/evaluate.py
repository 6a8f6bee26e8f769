"""Evaluation of outcomes on the held-out test split (the final model, never a best epoch).

For every outcome: ``accuracy`` on the global test set and ``personal_accuracy`` — each
client's accuracy re-weighted to its own training label distribution, averaged over clients.
For personalised outcomes each client's own model is used; ``accuracy`` is the mean over
clients and ``accuracy_best`` / ``accuracy_worst`` the extremes (the best is an oracle pick
reported for comparison, never used for selection).
"""

from __future__ import annotations

import numpy as np
import torch

from oneshotfl.data.types import LabelledData
from oneshotfl.federation.outcome import Ensemble, GlobalModel, Outcome, Personalised


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


def evaluate_outcome(
    outcome: Outcome, test: LabelledData, histograms: np.ndarray, device: torch.device
) -> dict[str, float | list[float]]:
    """Metrics of an outcome; ``histograms`` is the ``[clients, classes]`` label count matrix."""
    num_classes = histograms.shape[1]
    if isinstance(outcome, GlobalModel | Ensemble):
        probs = outcome.predict_proba(test.x, device)
        class_acc = per_class_accuracy(probs, test.y, num_classes)
        personal = [label_weighted(class_acc, h) for h in histograms]
        return {
            "accuracy": float((probs.argmax(1) == test.y).double().mean()),
            "personal_accuracy": float(np.nanmean(personal)),
            "per_class_accuracy": [float(a) for a in class_acc],
        }
    if isinstance(outcome, Personalised):
        return _evaluate_personalised(outcome, test, histograms, device)
    raise TypeError(f"expected a GlobalModel, Ensemble or Personalised outcome, got {outcome!r}")


def _evaluate_personalised(
    outcome: Personalised, test: LabelledData, histograms: np.ndarray, device: torch.device
) -> dict[str, float | list[float]]:
    num_classes = histograms.shape[1]
    accs, personal = [], []
    for cid in sorted(outcome.models):
        probs = outcome.predict_proba_for(cid, test.x, device)
        accs.append(float((probs.argmax(1) == test.y).double().mean()))
        personal.append(
            label_weighted(per_class_accuracy(probs, test.y, num_classes), histograms[cid])
        )
    return {
        "accuracy": float(np.mean(accs)),
        "accuracy_best": float(np.max(accs)),
        "accuracy_worst": float(np.min(accs)),
        "personal_accuracy": float(np.nanmean(personal)),
        "client_accuracy": accs,
    }
