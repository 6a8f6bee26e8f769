"""Content hashes of tensors: the keys of cached artefacts and memoised results."""

from __future__ import annotations

import hashlib

import torch


def tensor_fingerprint(*tensors: torch.Tensor) -> str:
    """A hash of the tensors' dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for t in tensors:
        c = t.detach().cpu().contiguous()
        digest.update(f"{c.dtype}{tuple(c.shape)}".encode())
        digest.update(c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b"")
    return digest.hexdigest()


__all__ = ["tensor_fingerprint"]
