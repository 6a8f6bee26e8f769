"""The authors' FedCGS server step, as ``benchmarks/authors/fedcgs_authors.py`` runs it (their
``main_fedcgs.py`` lines unedited, through ``load.authors_lines``), agrees with ours on small
synthetic statistics. It needs a checkout named by ``FEDCGS_REPO`` and is skipped, naming it,
without one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oneshotfl.methods.fedcgs import FedCgsConfig, fedcgs_head
from oneshotfl.methods.ghofl import class_statistics
from test_authors_dedes_regmean import authors_plugin


def test_the_authors_server_step_is_ours(
    forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = authors_plugin(
        "fedcgs_authors", ("FEDCGS_REPO", "Yuqin-G/FedCGS"), forget, monkeypatch
    )
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    x = (rng.normal(0, 2, (3, 8))[y] + rng.normal(0, 1, (200, 8))).astype(np.float32)
    payloads = {c: class_statistics(x[i], y[i], 3, "lda") for c, i in
                enumerate(np.array_split(np.argsort(y, kind="stable"), 4))}  # fmt: skip
    theirs = module.authors_head(payloads, torch.device("cpu"))
    stats = {k: np.add.reduce([p.arrays[k] for p in payloads.values()]) for k in payloads[0].arrays}
    ours, _ = fedcgs_head(stats, FedCgsConfig())
    probe = torch.from_numpy(x)
    want = ours(probe)
    assert torch.allclose(theirs(probe), want, rtol=1e-4, atol=1e-3)
    assert (theirs(probe).argmax(1) == want.argmax(1)).float().mean() == 1.0
    absent = {c: class_statistics(x[y < 2], y[y < 2], 3, "lda") for c in (0,)}
    with pytest.raises(ValueError, match="expected every class held by some client"):
        module.authors_head(absent, torch.device("cpu"))
