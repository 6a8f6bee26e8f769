"""Data kinds (issue 36): a method that corrupts, crops, blurs or generates images declares
the images it needs (``Requires.images``, ``image_multiple``), and a run whose data cannot give
them — a table, or too small a side — is refused before anything trains, naming every such
method; every other method runs to the end on a table with the ``mlp``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fingerprints import contract_config, contract_method, contract_params, recorded
from helpers import run_config, run_method
from oneshotfl.cli.describe import describe_method
from oneshotfl.data.types import TaskInfo
from oneshotfl.methods import METHODS, MethodSpec, build_method
from oneshotfl.models.generator import ImageGenerator
from oneshotfl.protocol.contract import Requires
from oneshotfl.runner import experiment
from oneshotfl.runner.checks import image_problems
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import RequirementError
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import preflight
from oneshotfl.training.negatives import corrupt, jigsaw

NAMES = METHODS.names()
IMAGE_METHODS = [n for n in NAMES if not METHODS.get(n).requires.takes_side(1)]
TABLE_METHODS = [n for n in NAMES if n not in IMAGE_METHODS]
DECLARED = {
    n: (recorded(n)["requires"]["images"], recorded(n)["requires"]["image_multiple"])
    for n in IMAGE_METHODS
}
"""The image methods and the images each needs (least side, multiple), as their contract
records pin them (``tests/contract/<name>.json``)."""


def write_table(root: Path, rows: int = 200, features: int = 30) -> str:
    """A two-class table ``[rows, features]`` of floats as an npz dataset spec."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    np.savez(root / "table.npz", x=x, y=y)
    return f"npz:path={root / 'table.npz'}"


def write_images(root: Path, side: int, rows: int = 200) -> str:
    """Two classes of grey ``side``×``side`` uint8 images as an npz dataset spec."""
    rng = np.random.default_rng(side)
    x = rng.integers(0, 256, (rows, side, side), dtype=np.uint8)
    np.savez(root / f"side{side}.npz", x=x, y=np.arange(rows) % 2)
    return f"npz:path={root / f'side{side}.npz'}"


def config(name: str, dataset: str, **overrides: Any) -> Any:
    """The contract's tiny federation of ``name`` (its requirements met, one epoch, an
    ``mlp``) on ``dataset``; a shared encoder is the ``identity`` one, which takes a table."""
    encoder = {"encoder": "identity"} if METHODS.get(name).requires.shared_encoder else {}
    return contract_config(name, dataset=dataset, **{**encoder, **overrides})


def prepare(cfg: Any) -> Federation:
    """The federation of ``cfg`` as a run prepares it: checked by preflight, its methods'
    needs checked against the data."""
    return Federation.prepare(preflight(cfg))


def test_the_image_methods_are_declared() -> None:
    declared = {
        n: (METHODS.get(n).requires.images, METHODS.get(n).requires.image_multiple)
        for n in IMAGE_METHODS
    }
    assert declared == DECLARED
    assert {"fedov", "fedeov", "intactofl", "dense", "f_adi"} <= set(DECLARED)  # no table


def test_image_problems_name_every_method_the_inputs_cannot_serve() -> None:
    methods = [(n, build_method(n)) for n in NAMES]
    table = image_problems(methods, TaskInfo("t", 2, 30, 1))
    assert [p.split(" ")[0] for p in table] == IMAGE_METHODS
    assert all(p.endswith("got a table of 30 features (inputs of side 1)") for p in table)
    six = image_problems(methods, TaskInfo("t", 2, 1, 6))
    refused = {n for n, (side, m) in DECLARED.items() if side > 6 or 6 % m}
    assert {p.split(" ")[0] for p in six} == refused and "intactofl" in refused
    assert "intactofl needs images of side >= 4, a multiple of 4" in "; ".join(six)
    assert image_problems(methods, TaskInfo("digits", 10, 1, 8)) == []


def test_a_requirement_is_sane_and_said_in_words() -> None:
    assert Requires().image_need == "" and Requires(images=1).takes_side(1)
    assert Requires(images=5).image_need == "images of side >= 5"
    assert not Requires(images=4, image_multiple=4).takes_side(6)
    with pytest.raises(ValueError, match="image_multiple >= 1"):
        Requires(image_multiple=0)


def test_a_table_is_refused_before_anything_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(experiment, "run_method", lambda key, *a, **k: ran.append(key))
    cfg = config("fedov", write_table(tmp_path), methods=["fedavg", "fedov"])
    with pytest.raises(RequirementError) as info:
        run_config(cfg)
    assert str(info.value) == (
        "cannot run: fedov needs images of side >= 5 (it transforms or generates images), "
        "got a table of 30 features (inputs of side 1)"
    )
    assert ran == []  # fedavg, listed first, never started


def test_every_image_method_listed_is_named(tmp_path: Path) -> None:
    keys = ["fedavg", "fedov", "fedeov:grid=2", "local", "intactofl:rounds=1", "f_dafl"]
    cfg = config("fedov", write_table(tmp_path), methods=keys)
    with pytest.raises(RequirementError) as info:
        prepare(cfg)
    named = [p.split(" ")[0] for p in str(info.value).removeprefix("cannot run: ").split("; ")]
    assert named == ["fedov", "fedeov:grid=2", "intactofl:rounds=1", "f_dafl"]


@pytest.mark.parametrize("name", NAMES)
def test_every_method_declares_images_or_runs_to_the_end_on_a_table(
    name: str, tmp_path: Path
) -> None:
    """None crashes after training started: an image method is refused up front, any
    other runs on a table of 30 features with every client replying."""
    cfg = config(name, write_table(tmp_path))
    if name in IMAGE_METHODS:
        with pytest.raises(RequirementError, match=f"cannot run: {name} needs images"):
            prepare(cfg)
        return
    result = run_method(name, contract_method(name), prepare(cfg))
    assert not result.get("no_reply") and not result.get("rejected")
    assert result["clients_used"] == [0, 1, 2]
    assert 0.0 <= result["accuracy"] <= 1.0


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_an_image_method_runs_on_the_least_side_it_declares(name: str, tmp_path: Path) -> None:
    """The declared side is enough (digits, 8×8, is above every one). FedEOV's curriculum
    reaches its jigsaw stages with eight epochs."""
    req = METHODS.get(name).requires
    side = next(s for s in range(1, 64) if req.takes_side(s))
    epochs = {"local_epochs": 8} if name.startswith("fedeov") else {}
    fed = prepare(config(name, write_images(tmp_path, side), **epochs))
    assert fed.data.task.image_size == side
    result = run_method(name, contract_method(name), fed)
    assert not result.get("no_reply") and result["clients_used"] == [0, 1, 2]


def test_one_below_the_declared_side_the_image_operations_fail() -> None:
    """Why the sides are what they are: FedOV's blur pads by up to 4 (a kernel of 9),
    FedEOV's by up to 3 and its jigsaw cuts 4 × 4 patches, the generator upsamples twice by
    2, and DeepInversion's prior compares neighbouring pixels."""
    g = torch.Generator().manual_seed(0)
    for style, side in (("fedov", 5), ("fedeov", 4)):
        for seed in range(20):
            corrupt(torch.randn(32, 1, side, side), style, g.manual_seed(seed))
        with pytest.raises(RuntimeError, match="Padding size"):
            for seed in range(20):
                corrupt(torch.randn(32, 1, side - 1, side - 1), style, g.manual_seed(seed))
    jigsaw(torch.randn(4, 1, 4, 4), 4, g)
    with pytest.raises(ValueError, match="grid"):
        jigsaw(torch.randn(4, 1, 3, 3), 4, g)
    ImageGenerator(8, 4, TaskInfo("t", 2, 1, 4))
    with pytest.raises(ValueError, match="divisible by 4"):
        ImageGenerator(8, 4, TaskInfo("t", 2, 1, 6))


def test_digits_still_runs_the_image_methods() -> None:
    """Every image method (the registry's, each at its contract budget) runs on 8×8 digits."""
    keys = [MethodSpec(n, contract_params(n)).key for n in IMAGE_METHODS]
    cfg = contract_config("fedeov_distilled", methods=keys, local_epochs=2)
    doc = run_config(cfg)
    for entry in doc["methods"]:
        assert not entry.get("no_reply") and entry["clients_used"] == [0, 1, 2], entry["key"]


def test_describe_says_which_images_a_method_needs() -> None:
    assert "\n  input: images of side >= 5 (tables refused)\n" in describe_method("fedov")
    intact = describe_method("intactofl")
    assert "\n  input: images of side >= 4, a multiple of 4 (tables refused)\n" in intact
    assert "\n  input: any (images or a table)\n" in describe_method("fedavg")


def test_an_encoder_that_cannot_take_the_data_is_refused_before_training(
    tmp_path: Path,
) -> None:
    """A convolutional shared encoder on a table's 1×1 "images" is refused once the data is
    loaded (it failed mid-run before); the ``identity`` encoder takes a table."""
    table = write_table(tmp_path)
    with pytest.raises(ConfigError, match=r"encoder 'random:dim=8' cannot take this data \(30 "):
        prepare(config("fedage", table, encoder="random:dim=8"))
    with pytest.raises(ConfigError, match=r"encoder 'simclr:epochs=1' cannot be built on this"):
        prepare(config("fedage", table, encoder="simclr:epochs=1", public_size=50))
    assert prepare(config("fedage", table)).encoder is not None  # identity
