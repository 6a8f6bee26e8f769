"""Choosing the compute device once, in the runner."""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda`` (or ``cuda:N``) into a ``torch.device``.

    Raises:
        ValueError: for an unknown choice, or ``cuda`` when no CUDA device is present.
    """
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" or choice.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {choice!r} was asked for but torch sees no CUDA device; "
                "use --device cpu or --device auto"
            )
        return torch.device(choice)
    raise ValueError(f"unknown device {choice!r}; expected one of auto, cpu, cuda, cuda:N")
