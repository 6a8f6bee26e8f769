"""The authors' FAFI server step, as ``benchmarks/authors/fafi_authors.py`` runs it (their
``our_main.py`` lines unedited), predicts as ours on the same client models. It needs a
checkout named by ``FAFI_REPO`` and is skipped, naming it, without one."""

from __future__ import annotations

import pytest
import torch

from helpers import make_server_context
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods.fafi import Fafi
from oneshotfl.models import create_model
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.outcome import GlobalModel
from test_authors_dedes_regmean import authors_plugin


def test_the_authors_server_step_predicts_as_ours(
    forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = authors_plugin(
        "fafi_authors", ("FAFI_REPO", "zenghui9977/FAFI_ICML25"), forget, monkeypatch
    )
    torch.manual_seed(0)
    payloads = {
        c: model_fields(create_model("mlp", 1, 10, 8)).merged(Payload({}, {"n_examples": n}))
        for c, n in enumerate([50, 120, 300])
    }
    ctx = make_server_context(TaskInfo("digits", 10, 1, 8), client_archs=("mlp",) * 3)
    theirs = module.FafiAuthors().aggregate(payloads, ctx)
    ours = Fafi().aggregate(payloads, ctx)
    assert isinstance(theirs, GlobalModel) and isinstance(ours, GlobalModel)
    x = torch.randn(64, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(theirs.model(x).argmax(1), ours.model(x).argmax(1))
        assert torch.allclose(theirs.model(x), ours.model(x), atol=1e-5)
    weights = theirs.info["authors_weights"]
    assert weights == pytest.approx([50 / 470, 120 / 470, 300 / 470])
    assert 0.0 <= theirs.info["authors_printed_accuracy"] <= 1.0
