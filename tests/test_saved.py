"""Saving what a run built (``--save-models``): every star method's final model(s) as
safetensors beside ``result.json``, read back by ``Result.load_model`` into the same outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import oneshotfl
from helpers import TINY, prepare
from oneshotfl.api import Result
from oneshotfl.cli.main import app
from oneshotfl.data.datasets import DATASETS
from oneshotfl.data.user import parse_user_spec
from oneshotfl.data.user_csv import read_csv
from oneshotfl.protocol.outcome import Ensemble, GlobalModel
from oneshotfl.protocol.saved import SavedModelError
from oneshotfl.runner.config import ConfigError, make_config
from oneshotfl.training.loop import accuracy

METHODS = [
    "fedavg",
    "ensemble:combine=logits",
    "fedov:fgsm_steps=1",
    "centralized_head",
    "peer_ensemble",
]


def test_saved_models_reproduce_the_recorded_accuracy(tmp_path: Path) -> None:
    settings = {**TINY, "methods": METHODS, "encoder": "random:dim=16", "cache_dir": None}
    result = oneshotfl.run(settings, tmp_path / "run", save_models=True)
    test = prepare(make_config(settings)).data.test
    for key in ("fedavg", "ensemble:combine=logits", "fedov:fgsm_steps=1"):
        model = result.load_model(key)
        assert isinstance(model, GlobalModel if key == "fedavg" else Ensemble)
        probs = model.predict_proba(test.x, torch.device("cpu"))
        recorded = result.method(key).accuracy  # the same count of correct images (1e-6 << 1/N)
        assert accuracy(probs, test.y) == pytest.approx(recorded, abs=1e-6)
    fedov = result.load_model("fedov:fgsm_steps=1")
    assert isinstance(fedov, Ensemble) and fedov.rule == "abstention:5"
    assert (tmp_path / "run" / "models" / "fedavg.safetensors").is_file()
    with pytest.raises(SavedModelError, match="state dict of EncodedClassifier"):
        result.load_model("centralized_head")  # encoder + head: saved as its state
    with pytest.raises(ConfigError, match="server-free method's models stay on its clients"):
        result.load_model("peer_ensemble")
    again = oneshotfl.Result.load(tmp_path / "run")  # a result read back loads them too
    assert isinstance(again.load_model("fedavg"), GlobalModel)


def test_the_command_saves_models_and_needs_an_out(tmp_path: Path, tiny_config: Any) -> None:
    args = ["run", *(f"{k}={v}" for k, v in TINY.items()), "methods=fedavg", "--no-cache"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c"), "--save-models"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c" / "models" / "fedavg.safetensors").is_file()
    with pytest.raises(ConfigError, match="save_models: expected an out folder"):
        oneshotfl.run(tiny_config(methods=["fedavg"]), save_models=True)


def test_a_missing_or_damaged_model_file_is_one_line(tmp_path: Path) -> None:
    from oneshotfl.protocol.saved import load_outcome
    from oneshotfl.protocol.spec import WireDims

    dims = WireDims(10, 1, 8)
    with pytest.raises(SavedModelError, match="expected a saved model"):
        load_outcome(tmp_path / "gone.safetensors", dims)
    (tmp_path / "junk.safetensors").write_bytes(b"not a model at all")
    with pytest.raises(SavedModelError, match="expected a saved model"):
        load_outcome(tmp_path / "junk.safetensors", dims)


def test_a_bad_combining_rule_is_a_value_error() -> None:
    from oneshotfl.protocol.outcome import combiner

    with pytest.raises(ValueError, match="expected a number after ':'"):
        combiner("trimmed_mean:lots")
    assert combiner("trimmed_mean:0.1") is not None


def test_several_seeds_and_one_tracked_run_name_are_refused(tmp_path: Path) -> None:
    args = ["run", *(f"{k}={v}" for k, v in TINY.items()), "methods=fedavg", "--no-cache"]
    args += ["--seed", "0,1", "--track-run", "mine", "--out", str(tmp_path / "s")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--track-run names one run" in result.output
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_a_saved_model_predicts_on_raw_inputs(tmp_path: Path) -> None:
    """``Result.predict`` normalises raw pixels (or a table's raw features) as the run did."""
    settings = {**TINY, "methods": ["fedavg"], "cache_dir": None}
    result = oneshotfl.run(settings, tmp_path / "run", save_models=True)
    test = prepare(make_config(settings)).data.test
    mean, std = DATASETS.get("digits").mean, DATASETS.get("digits").std
    raw = test.x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)
    want = result.load_model("fedavg").predict_proba(test.x, torch.device("cpu"))  # type: ignore[union-attr]
    assert torch.allclose(result.predict("fedavg", raw), want, atol=1e-5)
    with pytest.raises(ConfigError, match=r"expected inputs \[N, 1, 8, 8\]"):
        result.normalise(np.zeros((2, 3, 8, 8), np.float32))

    rng = np.random.default_rng(0)
    x = rng.normal(50, 20, (120, 4))
    y = (x[:, 0] > 50).astype(int)
    csv = tmp_path / "t.csv"
    names = ["cold", "hot"]
    csv.write_text("\n".join(",".join(map(str, [*r, names[c]])) for r, c in zip(x, y, strict=True)))
    spec = f"csv:path={csv}"
    table = oneshotfl.run({**settings, "dataset": spec}, tmp_path / "t", save_models=True)
    loaded = prepare(make_config({**settings, "dataset": spec})).data.test
    _, opts = parse_user_spec(spec)
    raw_test = read_csv(spec, csv, opts)[2][:, :, 0, 0]  # the test rows as the file has them
    assert torch.allclose(table.normalise(raw_test), loaded.x, atol=1e-5)
    assert table.predict("fedavg", raw_test).shape == (len(raw_test), 2)
    # the labels' names are kept: result.json, Result, and the predicted labels
    assert table.class_names == ("cold", "hot") == Result.load(tmp_path / "t").class_names
    assert table.data["class_names"] == ["cold", "hot"]
    labels = table.predict_labels("fedavg", raw_test)
    best = table.predict("fedavg", raw_test).argmax(dim=1).tolist()
    assert labels == [names[i] for i in best]
    assert result.class_names == tuple(DATASETS.get("digits").class_names)
