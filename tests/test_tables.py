"""Tables as first-class data: a CSV loader, and per-feature standardisation on the training
split (on by default, ``standardise=false`` to keep the features as given)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers import run_config
from oneshotfl.data.user import load_user_dataset
from oneshotfl.data.user_options import UserDataError


def write_csv(path: Path, rows: list[list[Any]], header: list[str] | None = None) -> Path:
    lines = [] if header is None else [",".join(header)]
    lines += [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def table_rows(n: int = 60, seed: int = 0) -> list[list[Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = ["setosa", "versicolor", "virginica"][i % 3]
        rows.append([float(rng.normal(100 * (i % 3), 5)), float(rng.normal(0.01, 0.002)), label])
    return rows


def test_a_csv_table_loads_with_its_header_and_class_names(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "iris.csv", table_rows(), ["length", "width", "species"])
    data = load_user_dataset(f"csv:path={path}:label=species:standardise=false")
    assert data.num_classes == 3 and data.class_names == ("setosa", "versicolor", "virginica")
    assert data.train.x.shape[1:] == (2, 1, 1) and len(data.train) + len(data.test) == 60
    raw = np.array([[r[0], r[1]] for r in table_rows()], dtype=np.float32)
    assert float(data.train.x[:, 0].max()) <= raw[:, 0].max() + 1e-3  # as given
    headless = write_csv(tmp_path / "plain.csv", [[1.5, 2, 0], [0.5, 1, 1], [2.5, 3, 1]] * 4)
    plain = load_user_dataset(f"csv:path={headless}:label=2")
    assert plain.num_classes == 2 and plain.train.x.shape[1] == 2


def test_tables_are_standardised_on_the_training_split_unless_told(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", table_rows(90), ["a", "b", "y"])
    data = load_user_dataset(f"csv:path={path}")
    x = data.train.x.flatten(1).double()
    assert torch.allclose(x.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(x.std(0, unbiased=False), torch.ones(2, dtype=torch.float64), atol=1e-4)
    raw = load_user_dataset(f"csv:path={path}:standardise=false")
    train = raw.train.x.flatten(1).double()
    mean, std = train.mean(0), train.std(0, unbiased=False)
    want = (raw.test.x.flatten(1).double() - mean) / std  # the test split: the train's stats
    assert torch.allclose(data.test.x.flatten(1).double(), want, atol=1e-4)
    declared = load_user_dataset(f"csv:path={path}:mean=100:std=10")  # declared wins
    assert torch.allclose(declared.train.x, (raw.train.x - 100) / 10)
    npz = tmp_path / "t.npz"
    np.savez(npz, x=np.array([r[:2] for r in table_rows(90)], np.float32), y=np.arange(90) % 3)
    assert abs(float(load_user_dataset(f"npz:path={npz}").train.x[:, 0].mean())) < 1e-5


@pytest.mark.parametrize(
    ("rows", "option", "fragment"),
    [
        ([[1, 2, 0], [1, 0]], "", "line 2: expected 3 fields, got 2"),
        (
            [[1, 2, 0], [1, "x2", 1]],
            ":label=2",
            "row 2, column 1: expected a finite number, got 'x2'",
        ),
        (
            [[1, 2, 0], [" ", 2, 1]],
            ":label=2",
            "row 2, column 0: expected a finite number, got an empty cell",
        ),
        ([[1, 2, 0]] * 5, ":max_images=3", "expected at most 3 rows (max_images)"),
        ([[1, 2, 0]] * 5, ":label=kind", "label: expected an index below 3, got 'kind'"),
        ([[1, 2, -1]] * 5, "", "expected labels >= 0, got -1"),
    ],
)
def test_a_bad_csv_is_one_line_naming_the_problem(
    tmp_path: Path, rows: list[list[Any]], option: str, fragment: str
) -> None:
    path = write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(UserDataError, match=re.escape(fragment)):
        load_user_dataset(f"csv:path={path}{option}")


def test_a_missing_csv_is_named_as_a_csv(tmp_path: Path) -> None:
    from oneshotfl.data.user_options import UserDataNotFoundError
    from oneshotfl.runner.config import ConfigError, ExperimentConfig

    with pytest.raises(
        UserDataNotFoundError, match=r"expected a \.csv file at .*iris2\.csv, got nothing"
    ):
        load_user_dataset(f"csv:path={tmp_path / 'iris2.csv'}")
    with pytest.raises(ConfigError, match=r"npz:path=FILE or csv:path=FILE"):
        ExperimentConfig(dataset="irs")
    holes = write_csv(tmp_path / "holes.csv", [[1, 2, "a"], [3, "", "b"]], ["len", "wid", "kind"])
    with pytest.raises(
        UserDataError, match=r"row 2, column 'wid': expected a finite number, got an empty cell"
    ):
        load_user_dataset(f"csv:path={holes}:label=kind")


def test_an_unscaled_table_trains_once_standardised(tiny_config: Any, tmp_path: Path) -> None:
    """scikit-learn's breast-cancer table as a user's CSV: standardised by default, a small
    MLP federation learns it; as given (features from 0.001 to 4 000) it does much worse."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    path = write_csv(tmp_path / "bc.csv", [[*row, int(c)] for row, c in zip(x, y, strict=True)])
    runs = {}
    for standardise in ("true", "false"):
        cfg = tiny_config(
            dataset=f"csv:path={path}:standardise={standardise}",
            methods=["centralized", "fedavg"], local_epochs=5, server_steps=0, lr=0.05,
        )  # fmt: skip
        runs[standardise] = {m["key"]: m["accuracy"] for m in run_config(cfg)["methods"]}
    assert runs["true"]["centralized"] > 0.9 and runs["true"]["fedavg"] > 0.85, runs
    assert runs["true"]["centralized"] > runs["false"]["centralized"] + 0.05, runs
