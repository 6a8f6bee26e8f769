"""User datasets (``folder:path=DIR``, ``npz:path=FILE``), on real image and .npz files."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from helpers import run_config
from oneshotfl.cli.main import app
from oneshotfl.data.datasets import DatasetFormatError, DatasetNotFoundError, load_dataset
from oneshotfl.data.feature_skew import Stats, dataset_stats
from oneshotfl.data.user import (
    USER_SPLIT_SEED,
    UserDataError,
    UserDataNotFoundError,
    carve_test,
    is_user_spec,
)
from oneshotfl.runner.config import ConfigError, load_config, make_config
from oneshotfl.runner.sweep import parse_sweep


def solid(path: Path, value: int, size: tuple[int, int] = (12, 9), mode: str = "RGB") -> None:
    """A one-colour image of ``value`` (so resizing keeps it) written with Pillow."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "I;16":
        Image.fromarray(np.full(size[::-1], value * 256, np.uint16)).save(path)
        return
    Image.new(mode, size, (value,) * len(mode) if mode in ("RGB", "RGBA") else value).save(path)


def folder(root: Path, counts: dict[str, int], value: Callable[[int], int] = lambda c: 40) -> Path:
    """``root/<class>/<i>.png``; class ``c``'s images have pixel value ``value(c)``."""
    for c, (name, n) in enumerate(sorted(counts.items())):
        for i in range(n):
            solid(root / name / f"{i:03d}.png", value(c))
    return root


def npz(path: Path, **arrays: Any) -> str:
    np.savez(path, **arrays)
    return f"npz:path={path}"


def grey(n: int, side: int = 8, classes: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.integers(0, 256, (n, side, side), dtype=np.uint8), "y": np.arange(n) % classes}


# --------------------------------------------------------------------------- folders


def test_folder_loads_classes_sizes_modes_and_normalisation(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    solid(root / "b_dog" / "one.PNG", 51, (40, 20))
    solid(root / "b_dog" / "nested" / "two.bmp", 51, mode="L")
    solid(root / "b_dog" / "three.gif", 51, mode="L")
    solid(root / "a_cat" / "x.jpg", 204, (7, 7))
    solid(root / "a_cat" / "y.tiff", 204, mode="RGBA")
    solid(root / "a_cat" / "z.png", 204, mode="I;16")  # 16-bit grey
    solid(root / "a_cat" / "v.webp", 204)
    solid(root / "a_cat" / "w.JPEG", 204)
    (root / "a_cat" / ".DS_Store").write_bytes(b"\0\1")
    (root / "a_cat" / "._x.png").write_bytes(b"AppleDouble")  # hidden: not an image
    (root / "README").write_text("not a class")
    (root / "b_dog" / "notes.txt").write_text("ignored")
    (root / ".hidden_class").mkdir()
    spec = f"folder:path={root}:size=16:channels=1:test_fraction=0.4:mean=0.2:std=0.4"
    ds = load_dataset(spec)
    assert ds.name == spec and ds.class_names == ("a_cat", "b_dog") and ds.num_classes == 2
    assert (len(ds.train), len(ds.test)) == (5, 3)  # cat 5 → 2 test; dog 3 → 1 test
    assert ds.train.x.shape[1:] == (1, 16, 16) and ds.train.x.dtype == torch.float32
    assert ds.train.y.dtype == torch.int64
    x, y = torch.cat([ds.train.x, ds.test.x]), torch.cat([ds.train.y, ds.test.y])
    for label, value in ((0, 204), (1, 51)):
        expected = (value / 255 - 0.2) / 0.4
        torch.testing.assert_close(
            x[y == label], torch.full_like(x[y == label], expected), atol=0.02, rtol=0
        )
    assert dataset_stats(spec) == Stats((0.2,), (0.4,))
    rgb = load_dataset(f"folder:path={root}")  # defaults: 3 channels, 32×32, 0.5/0.5
    assert rgb.train.x.shape[1:] == (3, 32, 32) and dataset_stats(f"folder:path={root}") == Stats(
        (0.5,) * 3, (0.5,) * 3
    )


def test_train_and_test_folders_are_the_splits(tmp_path: Path) -> None:
    folder(tmp_path / "d" / "train", {"x": 3, "y": 2}, lambda c: 100 * c)
    folder(tmp_path / "d" / "test", {"x": 1, "y": 2}, lambda c: 100 * c)
    (tmp_path / "d" / "val").mkdir()  # other entries are ignored
    ds = load_dataset(f"folder:path={tmp_path / 'd'}:size=4")
    assert ds.class_names == ("x", "y")
    assert ds.train.y.tolist() == [0, 0, 0, 1, 1] and ds.test.y.tolist() == [0, 1, 1]


def test_carved_split_is_stratified_and_fixed(tmp_path: Path) -> None:
    root = folder(tmp_path / "f", {"a": 10, "b": 5, "c": 1}, lambda c: 10 * c)
    first, again = (load_dataset(f"folder:path={root}:size=4") for _ in range(2))
    assert torch.bincount(first.test.y, minlength=3).tolist() == [2, 1, 0]  # round(0.2·n), n−1
    assert torch.bincount(first.train.y, minlength=3).tolist() == [8, 4, 1]
    assert torch.equal(first.test.x, again.test.x) and torch.equal(first.train.x, again.train.x)
    y = np.repeat([0, 1, 2], [10, 5, 1])
    rng = np.random.default_rng(USER_SPLIT_SEED)
    expected = np.zeros(len(y), bool)
    for c, n_test in ((0, 2), (1, 1), (2, 0)):
        expected[rng.permutation(np.flatnonzero(y == c))[:n_test]] = True
    assert np.array_equal(carve_test(y, 0.2), expected)


# --------------------------------------------------------------------------- npz files


@pytest.mark.parametrize("layout", ["NHW", "NHWC", "NCHW"])
def test_npz_layouts_and_uint8_normalisation(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (20, 3 if layout != "NHW" else 1, 6, 6), dtype=np.uint8)
    stored = {"NHW": x[:, 0], "NHWC": x.transpose(0, 2, 3, 1), "NCHW": x}[layout]
    spec = npz(tmp_path / "d.npz", x=stored, y=np.arange(20) % 4) + ":mean=0.25:std=2"
    ds = load_dataset(spec)
    assert ds.num_classes == 4 and ds.class_names == ("0", "1", "2", "3")
    assert (len(ds.train), len(ds.test)) == (16, 4)
    assert torch.bincount(ds.test.y).tolist() == [1, 1, 1, 1]
    expected = (torch.from_numpy(x).float() / 255 - 0.25) / 2
    got = torch.cat([ds.train.x, ds.test.x])
    test = carve_test(np.arange(20) % 4, 0.2)
    order = torch.from_numpy(np.concatenate([np.flatnonzero(~test), np.flatnonzero(test)]))
    torch.testing.assert_close(got, expected[order])
    assert dataset_stats(spec) == Stats((0.25,) * x.shape[1], (2.0,) * x.shape[1])


def test_npz_given_test_split_float_pixels_and_classes(tmp_path: Path) -> None:
    x = np.full((4, 5, 5, 3), 0.75, np.float32)
    spec = npz(
        tmp_path / "d.npz",
        x=x,
        y=np.array([0, 1, 1, 0], np.uint8),
        x_test=x[:2].transpose(0, 3, 1, 2),  # its own layout
        y_test=np.array([2, 0]),
    )
    ds = load_dataset(spec + ":classes=5")
    assert ds.num_classes == 5 and (len(ds.train), len(ds.test)) == (4, 2)
    assert ds.test.y.tolist() == [2, 0] and ds.train.x.shape == (4, 3, 5, 5)
    torch.testing.assert_close(ds.test.x, torch.full((2, 3, 5, 5), 0.5))


# --------------------------------------------------------------------------- errors


def corrupt_folder(p: Path) -> str:
    root = folder(p / "c", {"a": 2, "b": 2})
    (root / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return f"folder:path={root}"


def flat_folder(p: Path) -> str:
    solid(p / "flat" / "a.png", 9)
    return f"folder:path={p / 'flat'}"


def empty_class(p: Path) -> str:
    root = folder(p / "e", {"full": 2})
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("no images here")
    return f"folder:path={root}"


def mismatched_splits(p: Path) -> str:
    folder(p / "s" / "train", {"a": 1, "b": 1})
    folder(p / "s" / "test", {"a": 1, "c": 1})
    return f"folder:path={p / 's'}"


def junk_npz(p: Path) -> str:
    (p / "bad.npz").write_bytes(b"junk")
    return f"npz:path={p / 'bad.npz'}"


FOLDER_ERRORS: list[tuple[Callable[[Path], str], str]] = [
    (lambda p: f"folder:path={p / 'missing'}", "expected a directory at .*missing, got nothing"),
    (lambda p: f"folder:path={npz(p / 'f.npz', **grey(4))[9:]}",
     "expected a directory at .*, got a file"),
    (flat_folder, "expected one subfolder per class in .*flat, got none"),
    (empty_class, r"expected images \(.*\) in class folder .*empty, got none"),
    (corrupt_folder, "expected a readable image in .*broken.jpg, got an unreadable one"),
    (mismatched_splits,
     r"expected the same class folders in .*train and .*test, got \['b'\] only in train and "
     r"\['c'\] only in test"),
    (lambda p: f"folder:path={folder(p / 'm', {'a': 3, 'b': 3})}:max_images=5",
     r"expected 1..5 images in all \(max_images\), got 6"),
    (lambda p: f"folder:path={folder(p / 'o', {'a': 1})}:size=8",
     "expected at least one test image, got none"),
    (lambda p: f"folder:path={p}:classes=3",
     r"unknown option\(s\) classes; expected some of channels"),
    (lambda p: f"folder:path={p}:size=1025", "size: expected 1..1024, got 1025"),
    (lambda p: f"folder:path={p}:channels=2", "channels: expected 1 or 3, got 2"),
    (lambda p: f"folder:path={p}:test_fraction=1", r"test_fraction: expected in \(0, 1\)"),
    (lambda p: f"folder:path={p}:std=0", "std: expected > 0"),
    (lambda p: "folder:size=8", r"path: expected a file or directory \(path=...\)"),
    (lambda p: f"folder:path={p}:sise=8", r"unknown option\(s\) sise"),
]  # fmt: skip


def pickled(p: Path) -> str:
    return npz(p / "o.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.array([0, 1], dtype=object))


def lying_header(p: Path) -> str:
    """An npz whose headers claim 10⁹ images of 32×32 and hold no data: refused unread."""
    with zipfile.ZipFile(p / "big.npz", "w") as archive:
        for key, shape, descr in (("x", (10**9, 32, 32), "|u1"), ("y", (10**9,), "<i8")):
            buffer = io.BytesIO()
            header = {"descr": descr, "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(buffer, header)
            archive.writestr(f"{key}.npy", buffer.getvalue())
    return f"npz:path={p / 'big.npz'}"


NPZ_ERRORS: list[tuple[Callable[[Path], str], str]] = [
    (lambda p: f"npz:path={p / 'nope.npz'}", "expected an .npz file at .*nope.npz, got nothing"),
    (junk_npz, "expected an .npz archive at .*bad.npz, got an unreadable one"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 4, 4), np.uint8)),
     r"expected arrays 'x' and 'y' in .*, got \['x'\]"),
    (lambda p: npz(p / "d.npz", y=np.zeros(2, int)), r"expected arrays 'x' and 'y' .* got \['y'\]"),
    (lambda p: npz(p / "d.npz", x=np.zeros((3, 4, 4), np.uint8), y=np.zeros(2, int)),
     r"expected 2 images in x \(one per label\), got 3"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 2, 4, 4), np.uint8), y=np.zeros(2, int)),
     r"expected x as images .* with C in \{1, 3\}, or a table \[N, D\], got shape \(2, 2, 4, 4\)"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 4, 4, 4, 1), np.uint8), y=np.zeros(2, int)),
     r"got shape \(2, 4, 4, 4, 1\)"),
    (lambda p: npz(p / "d.npz", x=np.zeros((1, 1025, 1025), np.uint8), y=np.zeros(1, int)),
     "expected x with sides in 1..1024, got 1025x1025"),
    (lambda p: npz(p / "d.npz", x=np.full((2, 3), np.inf), y=np.zeros(2, int)),
     "expected x as finite numbers, got non-finite values"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 4, 4), np.int16), y=np.zeros(2, int)),
     "expected x of dtype uint8 or float, got int16"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.array([0.0, 1.5])),
     r"expected y as integer labels \[N\], got float64"),
    (lambda p: npz(p / "d.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.zeros((2, 1), int)),
     r"expected y as integer labels \[N\], got int64 \(2, 1\)"),
    (lambda p: npz(p / "d.npz", x=np.zeros((4, 4, 4), np.uint8), y=np.array([0, -1, 1, 2])),
     "expected y as labels >= 0, got -1"),
    (lambda p: npz(p / "d.npz", x=np.full((2, 4, 4), 1.5, np.float32), y=np.zeros(2, int)),
     r"expected x as floats in \[0, 1\], got 1.5..1.5"),
    (lambda p: npz(p / "d.npz", x=np.full((2, 4, 4), np.nan), y=np.zeros(2, int)),
     r"expected x as finite numbers, got non-finite values"),
    (lambda p: npz(p / "d.npz", **grey(10), x_test=np.zeros((2, 8, 8), np.uint8)),
     "expected both x_test and y_test in .* or neither, got x_test"),
    (lambda p: npz(p / "d.npz", **grey(10), x_test=np.zeros((2, 6, 6), np.uint8),
                   y_test=np.zeros(2, int)),
     r"expected x_test like x: \(channels, height, width\) \(1, 8, 8\), got \(1, 6, 6\)"),
    (lambda p: npz(p / "d.npz", **grey(10, classes=4)) + ":classes=3",
     r"expected labels in 0..2 \(classes=3\), got 3"),
    (lambda p: npz(p / "d.npz", **grey(10)) + ":max_images=9",
     r"expected 1..9 images in all \(max_images\), got 10"),
    (lambda p: npz(p / "d.npz", **grey(10)) + ":size=8",
     r"unknown option\(s\) size; expected some of classes, max_images, mean, path, "
     "standardise, std, test_fraction"),
    (pickled, "array 'y' in .* holds Python objects, which need pickle"),
    (lambda p: npz(p / "d.npz", x=np.zeros((0, 4, 4), np.uint8), y=np.zeros(0, int),
                   x_test=np.zeros((1, 4, 4), np.uint8), y_test=np.zeros(1, int)),
     r"expected images in x, got shape \(0, 4, 4\)"),
    (lying_header, r"expected 1..2000000 images in all \(max_images\), got 1000000000"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "message"), FOLDER_ERRORS + NPZ_ERRORS)
def test_errors_are_one_clear_sentence(
    tmp_path: Path, make: Callable[[Path], str], message: str
) -> None:
    spec = make(tmp_path)
    with pytest.raises((UserDataError, UserDataNotFoundError), match=message) as info:
        load_dataset(spec)
    text = str(info.value)
    assert text.startswith(f"dataset {spec!r}") and "\n" not in text
    if "got nothing" in message:
        assert isinstance(info.value, DatasetNotFoundError)
    else:
        assert isinstance(info.value, DatasetFormatError)


def test_config_accepts_specs_and_rejects_unknown_names(tmp_path: Path) -> None:
    assert is_user_spec("npz:path=x") and is_user_spec("folder") and not is_user_spec("mnist")
    assert make_config({"dataset": "npz:path=later.npz"}).dataset == "npz:path=later.npz"
    expected = r"unknown 'nosuch'; expected one of: cifar10, .*digits, .*, or folder:path=DIR, "
    with pytest.raises(ConfigError, match=expected + "npz:path=FILE or csv:path=FILE"):
        make_config({"dataset": "nosuch"})
    with pytest.raises(ConfigError, match=r"unknown option\(s\) colour"):
        make_config({"dataset": "folder:path=x:colour=1"})
    (tmp_path / "c.yaml").write_text("dataset: folder:path=imgs:size=16\nclients: 2\n")
    assert load_config(tmp_path / "c.yaml", ["dataset=npz:path=d.npz:classes=4"]).dataset == (
        "npz:path=d.npz:classes=4"
    )
    sweep = parse_sweep({"grid": {"dataset": ["npz:path=/data/a.npz", "digits"]}, "seeds": [0]})
    assert [r.config.dataset for r in sweep.runs] == ["npz:path=/data/a.npz", "digits"]
    assert sweep.runs[0].run_id == "dataset=npz-path=-data-a.npz_seed=0"


def test_cli_shows_one_line_and_no_traceback(tmp_path: Path) -> None:
    args = ["run", "--dataset", f"npz:path={tmp_path / 'no.npz'}", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--no-cache"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "error: dataset 'npz:path=" in result.output and "got nothing" in result.output


# --------------------------------------------------------------------------- end to end


def test_run_on_npz_and_folder(tmp_path: Path, tiny_config: Callable[..., Any]) -> None:
    rng = np.random.default_rng(3)
    y = np.arange(300) % 3
    x = np.clip(rng.random((300, 8, 8)) * 0.5 + y[:, None, None] * 0.25, 0, 1).astype(np.float32)
    spec = npz(tmp_path / "d.npz", x=x, y=y)
    doc = run_config(tiny_config(dataset=spec, methods=["local", "fedavg"], feature_skew="color"))
    assert doc["config"]["dataset"] == doc["data"]["dataset"] == spec
    assert doc["data"]["num_classes"] == 3 and doc["data"]["input_shape"] == [3, 8, 8]
    assert [m["key"] for m in doc["methods"]] == ["local", "fedavg"]
    assert all(0 <= m["accuracy"] <= 1 for m in doc["methods"])
    root = folder(tmp_path / "img", {f"c{c}": 40 for c in range(3)}, lambda c: 60 * c + 20)
    spec = f"folder:path={root}:size=8:channels=1"
    doc = run_config(tiny_config(dataset=spec, methods=["local", "fedavg"]))
    assert doc["data"]["dataset"] == spec and doc["data"]["input_shape"] == [1, 8, 8]
    assert doc["data"]["test_size"] == 3 * 8 and len(doc["clients"]) == 3


def test_a_path_may_hold_a_colon_and_labels_may_not_leave_gaps(tmp_path: Path) -> None:
    from oneshotfl.data.user import load_user_dataset

    folder = tmp_path / "run:2026-11-25"
    folder.mkdir()
    x = np.zeros((20, 8, 8), np.uint8)
    np.savez(folder / "d.npz", x=x, y=np.arange(20) % 4)
    data = load_user_dataset(f"npz:path={folder / 'd.npz'}:test_fraction=0.25")
    assert data.num_classes == 4
    np.savez(folder / "gap.npz", x=x, y=np.array([0, 1, 7] * 6 + [0, 1]))
    with pytest.raises(UserDataError, match=r"expected every label 0..7 in y .*none of \[2, 3"):
        load_user_dataset(f"npz:path={folder / 'gap.npz'}")
    declared = load_user_dataset(f"npz:path={folder / 'gap.npz'}:classes=8")
    assert declared.num_classes == 8  # declared: empty classes are the user's choice


def test_non_square_images_are_padded_and_tables_are_features(
    tiny_config: Any, tmp_path: Path
) -> None:
    from oneshotfl.data.user import load_user_dataset
    from oneshotfl.runner.config import ConfigError

    rng = np.random.default_rng(0)
    wide = rng.integers(0, 255, (40, 3, 6, 10), np.uint8)
    np.savez(tmp_path / "wide.npz", x=wide, y=np.arange(40) % 4)
    data = load_user_dataset(f"npz:path={tmp_path / 'wide.npz'}")
    assert data.train.x.shape[1:] == (3, 10, 10)  # padded to the longer side, centred
    padded = data.train.x[0]
    assert torch.equal(padded[:, :2], torch.full((3, 2, 10), -1.0))  # zeros, normalised
    table = rng.normal(0, 3, (200, 7)).astype(np.float32)
    labels = (table[:, 0] > 0).astype(np.int64) + 2 * (table[:, 1] > 0)
    np.savez(tmp_path / "table.npz", x=table, y=labels)
    spec = f"npz:path={tmp_path / 'table.npz'}"
    rows = load_user_dataset(spec + ":standardise=false")
    assert rows.train.x.shape[1:] == (7, 1, 1) and rows.num_classes == 4
    kept = np.concatenate([rows.train.x.numpy().reshape(-1, 7), rows.test.x.numpy().reshape(-1, 7)])
    assert np.isclose(np.sort(kept, axis=0), np.sort(table, axis=0)).all()  # taken as given
    doc = run_config(
        tiny_config(dataset=spec, model="mlp", methods=["fedavg"], clients=2, partition="iid")
    )
    assert doc["methods"][0]["accuracy"] > 0.5  # four quadrants an MLP separates
    with pytest.raises(ConfigError, match="model 'cnn' cannot take this data"):
        run_config(tiny_config(dataset=spec, model="cnn", methods=["fedavg"], clients=2))
