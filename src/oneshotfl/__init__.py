"""oneshotfl: one-shot federated learning methods on one shared, reproducible core."""

__version__ = "0.1.0"
