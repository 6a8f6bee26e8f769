"""Memoised test logits (``oneshotfl.training.memo``): one forward pass per distinct model,
the same numbers as recomputing, never a wrong hit."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from oneshotfl.methods.fedeov import KnownClasses
from oneshotfl.models import create_model
from oneshotfl.training.loop import predict_logits
from oneshotfl.training.memo import fingerprint, memoised_logits

CPU = torch.device("cpu")


def _model(seed: int, classes: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("cnn", 1, classes, 8)


def test_a_model_decoded_again_is_answered_from_the_memo_with_the_same_numbers() -> None:
    x, other = torch.randn(50, 1, 8, 8), torch.randn(50, 1, 8, 8)
    model = _model(0)
    plain = predict_logits(model, x, CPU)
    with memoised_logits(x) as stats:
        first = predict_logits(model, x, CPU)
        again = predict_logits(copy.deepcopy(model), x, CPU)  # a fresh copy, same weights
        again[:] = 0  # the caller's copy: the memo keeps its own
        third = predict_logits(copy.deepcopy(model), x, CPU)
        predict_logits(model, other, CPU)  # another input: never memoised
        predict_logits(model, x[:10], CPU)  # a view is another tensor: never memoised
    assert torch.equal(first, plain) and torch.equal(third, plain)
    assert (stats().hits, stats().misses) == (2, 1)


def test_what_changes_the_function_changes_the_fingerprint() -> None:
    model = _model(0)
    assert fingerprint(model) == fingerprint(copy.deepcopy(model))
    assert fingerprint(model) != fingerprint(_model(1))  # other weights
    changed = copy.deepcopy(model)
    buffers = [b for b in changed.buffers() if b.dtype.is_floating_point]
    if buffers:  # BatchNorm statistics count
        buffers[0].add_(1.0)
        assert fingerprint(changed) != fingerprint(model)
    open_set = _model(0, classes=5)
    assert fingerprint(KnownClasses(open_set, 4)) != fingerprint(KnownClasses(open_set, 3))
    assert fingerprint(KnownClasses(open_set, 4)) != fingerprint(open_set)


def test_models_that_differ_are_each_run_under_the_memo() -> None:
    x = torch.randn(30, 1, 8, 8)
    open_set = _model(2, classes=5)
    with memoised_logits(x) as stats:
        wide = predict_logits(open_set, x, CPU)
        narrow = predict_logits(KnownClasses(open_set, 4), x, CPU)
        predict_logits(_model(3), x, CPU)
    assert torch.equal(narrow, wide[:, :4])
    assert (stats().hits, stats().misses) == (0, 3)


def test_a_run_evaluates_the_shared_client_models_once(
    tiny_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from helpers import run_config

    methods = ["local", "ensemble", "ensemble:combine=logits", "fedavg"]
    with caplog.at_level(logging.DEBUG, logger="oneshotfl.runner.experiment"):
        cfg = tiny_config(methods=methods, workers=1)  # every client step in this process
        run_config(cfg)
    line = next(r.getMessage() for r in caplog.records if "test logits" in r.getMessage())
    run, memoised = (int(w) for w in line.split() if w.isdigit())
    clients = cfg.clients
    # each client model once (local, both ensembles and the local-model facts share them),
    # fedavg's average once more
    assert run == clients + 1 and memoised >= 3 * clients
