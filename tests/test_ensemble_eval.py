"""Outcomes evaluated at their members' speed (issue 53, item 3): on a CPU each model runs with
its convolution weights in channels-last layout for the call, and the answer is the model's
own up to the floating-point order of the kernels; the model itself is left as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from oneshotfl.models.base import create_model
from oneshotfl.models.stacked import channels_last_weights, pass_kind, stacked_logits
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Personalised
from oneshotfl.runner.evaluate import evaluate_outcome
from oneshotfl.training import memo
from oneshotfl.training.loop import many_logits, predict_logits

CPU = torch.device("cpu")


def _members(arch: str, n: int, channels: int = 1, side: int = 28) -> list[nn.Module]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(create_model(arch, channels, 10, side).eval())
    return out


def _layout(model: nn.Module) -> list[tuple[int, tuple[int, ...], int, int]]:
    """Each tensor's identity, strides, storage and version counter."""
    tensors = [*model.parameters(), *model.buffers()]
    return [(id(t), t.stride(), t.untyped_storage().data_ptr(), t._version) for t in tensors]


def test_channels_last_weights_are_copies_in_that_layout_even_of_one_input_channel() -> None:
    model = _members("cnn", 1)[0]
    before = _layout(model)
    weights = channels_last_weights(model)
    assert sorted(weights) == ["conv.0.weight", "conv.3.weight"]
    params = dict(model.named_parameters())
    for name, w in weights.items():
        # the channel innermost, also for conv.0's one input channel (`.contiguous` leaves it)
        assert w.is_contiguous(memory_format=torch.channels_last) and w.stride()[1] == 1
        assert torch.equal(w, params[name]) and w.data_ptr() != params[name].data_ptr()
    assert _layout(model) == before
    assert channels_last_weights(_members("mlp", 1)[0]) == {}


@pytest.mark.parametrize(
    ("arch", "channels", "side"),
    [("cnn", 1, 28), ("simple_cnn2", 1, 28), ("fedavg_cnn", 3, 16), ("resnet8", 3, 16),
     ("mlp", 1, 8)],
)  # fmt: skip
def test_a_cpu_evaluation_is_the_models_own_answer_and_leaves_them_as_they_were(
    arch: str, channels: int, side: int
) -> None:
    models = _members(arch, 3, channels, side)
    before = [_layout(m) for m in models]
    x = torch.randn(300, channels, side, side)
    got = many_logits(models, x, CPU, batch_size=128, stack=False)
    for model, logits, layout in zip(models, got, before, strict=True):
        want = predict_logits(model, x, CPU)
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-5)
        assert _layout(model) == layout and not model.training
    # stacked on a CPU is one model at a time too: the same kernels, the same answers
    for a, b in zip(stacked_logits(models, x, CPU, 128), got, strict=True):
        assert torch.equal(a, b)


def test_every_outcome_kind_evaluates_through_one_path() -> None:
    """An ensemble's, a global model's and personalised models' probabilities are those of
    their models' logits in :func:`many_logits`, and the memo runs each model once."""
    models = _members("cnn", 3)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    logits = many_logits(models, x, CPU)
    ensemble = Ensemble(models, rule="logits")
    want = ensemble.combine(torch.stack(logits), ensemble.weights)  # type: ignore[arg-type]
    assert torch.equal(ensemble.predict_proba(x, CPU), want)
    assert torch.equal(GlobalModel(models[0]).predict_proba(x, CPU), logits[0].softmax(-1))
    personal = Personalised(dict(enumerate(models)))
    assert torch.equal(personal.predict_proba_for(2, x, CPU), logits[2].softmax(-1))

    class Split:  # the test split evaluate_outcome reads
        def __init__(self) -> None:
            self.x, self.y = x, y

        def __len__(self) -> int:
            return len(y)

    histograms = np.ones((3, 10))
    with memo.memoised_logits(x) as stats:
        for outcome in (ensemble, GlobalModel(models[1]), personal):
            evaluate_outcome(outcome, Split(), histograms, CPU)  # type: ignore[arg-type]
        assert stats() == memo.MemoStats(hits=4, misses=3)


def test_the_memo_keys_say_how_the_logits_were_computed() -> None:
    assert pass_kind(CPU, stack=True) == pass_kind(CPU, stack=False) == "channels_last"
    gpu = torch.device("cuda")
    assert (pass_kind(gpu, stack=True), pass_kind(gpu, stack=False)) == ("stacked", "each")
