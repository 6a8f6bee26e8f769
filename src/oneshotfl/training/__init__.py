"""The one training loop every client and server step in oneshotfl uses."""

from oneshotfl.training.loop import (
    FitStats,
    TrainConfig,
    accuracy,
    fit,
    predict_logits,
    train_classifier,
)

__all__ = ["FitStats", "TrainConfig", "accuracy", "fit", "predict_logits", "train_classifier"]
