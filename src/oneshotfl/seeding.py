"""Named, independent random streams derived from integer seeds.

Every random choice in oneshotfl draws from a stream named by what it is for
(``derive_seed(seed, "client", 3, "train")``), so adding a client or a method never shifts the
randomness of another. The partition seed and the model seed are separate roots.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import numpy as np
import torch


def derive_seed(root: int, *names: object) -> int:
    """A 63-bit seed determined by ``root`` and the stream ``names`` (stable across runs)."""
    text = "/".join([str(root), *(str(n) for n in names)])
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def numpy_rng(root: int, *names: object) -> np.random.Generator:
    """A NumPy generator for the named stream."""
    return np.random.default_rng(derive_seed(root, *names))


def torch_generator(root: int, *names: object) -> torch.Generator:
    """A CPU ``torch.Generator`` for the named stream (used for shuffling)."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(root, *names))
    return gen


@contextlib.contextmanager
def seeded_torch(root: int, *names: object) -> Iterator[None]:
    """Seed torch's global RNG inside the block only (model initialisation uses it).

    The global state is restored on exit, so code outside the block is unaffected.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(root, *names))
        yield
