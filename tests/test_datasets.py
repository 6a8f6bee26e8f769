"""Dataset loaders, each tested on tiny files written here in that dataset's real format."""

from __future__ import annotations

import dataclasses
import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from oneshotfl.data.catalog import DIGITS_SPLIT_SEED
from oneshotfl.data.datasets import (
    DATASETS,
    DatasetFormatError,
    DatasetNotFoundError,
    DatasetSpec,
    list_datasets,
    load_dataset,
    search_dirs,
)
from oneshotfl.data.formats import UnsafePickleError, read_cifar_batch, read_idx

FMNIST_SYSTEM = Path("/usr/share/datasets/fashion-mnist")
IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONESHOTFL_DATA", raising=False)


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_mnist_like(
    folder: Path,
    n_train: int = 6,
    n_test: int = 4,
    compress: bool = True,
    size: int = 28,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n_train, size, size), dtype=np.uint8)
    y = (np.arange(n_train) % 10).astype(np.uint8)
    suffix = ".gz" if compress else ""
    arrays = (x, y, x[:n_test], y[:n_test])
    for stem, array in zip(IDX_STEMS, arrays, strict=True):
        write_idx(folder / f"{stem}{suffix}", array, compress)
    return x, y


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("sub", ["", "fashion_mnist", "fashion-mnist", "FashionMNIST/raw"])
def test_fashion_mnist_idx(tmp_path: Path, compress: bool, sub: str) -> None:
    x, y = write_mnist_like(tmp_path / sub, compress=compress)
    data = load_dataset("fashion_mnist", root=tmp_path)
    assert data.train.x.shape == (6, 1, 28, 28) and data.train.x.dtype == torch.float32
    assert data.test.x.shape == (4, 1, 28, 28) and data.train.y.dtype == torch.int64
    np.testing.assert_array_equal(data.train.y.numpy(), y)
    # normalisation: (x/255 - 0.2860) / 0.3530, pixel (row 5, column 7) stays in place
    expected = (x[2, 5, 7] / 255.0 - 0.2860) / 0.3530
    assert data.train.x[2, 0, 5, 7].item() == pytest.approx(expected, abs=1e-5)
    assert data.num_classes == 10 and data.class_names[0] == "T-shirt/top"
    assert data.in_channels == 1 and data.image_size == 28


def test_idx_files_may_mix_gzip_and_raw(tmp_path: Path) -> None:
    write_mnist_like(tmp_path, compress=False)
    raw = tmp_path / "t10k-images-idx3-ubyte"
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    assert len(load_dataset("mnist", root=tmp_path).test) == 4


def test_mnist_torchvision_layout(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "MNIST" / "raw")
    data = load_dataset("mnist", root=tmp_path)
    assert len(data.train) == 6 and data.in_channels == 1 and data.image_size == 28
    assert data.class_names == tuple(str(i) for i in range(10))


def test_environment_variable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist_like(tmp_path)
    monkeypatch.setenv("ONESHOTFL_DATA", str(tmp_path))
    assert len(load_dataset("mnist").train) == 6


def test_root_argument_wins_over_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_mnist_like(tmp_path / "arg", n_train=7)
    write_mnist_like(tmp_path / "env", n_train=9)
    monkeypatch.setenv("ONESHOTFL_DATA", str(tmp_path / "env"))
    assert len(load_dataset("mnist", root=tmp_path / "arg").train) == 7
    (tmp_path / "empty").mkdir()  # a root without the files: the search goes on
    assert len(load_dataset("mnist", root=tmp_path / "empty").train) == 9
    with pytest.raises(DatasetNotFoundError, match="expected an existing directory"):
        load_dataset("mnist", root=tmp_path / "missing")  # a typo is not silently ignored


def test_fashion_mnist_search_order_and_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONESHOTFL_DATA", str(tmp_path / "env"))
    spec = DATASETS.get("fashion_mnist")
    assert search_dirs(spec, tmp_path / "arg") == [
        tmp_path / "arg",
        tmp_path / "env",
        FMNIST_SYSTEM,
    ]
    assert search_dirs(DATASETS.get("mnist"), None) == [tmp_path / "env"]
    assert "apt-get install -y dataset-fashion-mnist" in spec.hint


def test_bad_idx_magic_is_a_value_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.gz"
    bad.write_bytes(gzip.compress(b"\x01\x02\x03\x04rest"))
    with pytest.raises(ValueError, match=r"x\.gz: expected an IDX file .* got magic 01020304"):
        read_idx(bad)
    write_mnist_like(tmp_path / "m", compress=False)
    (tmp_path / "m" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x99\x03" + bytes(12))
    with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte: expected an IDX"):
        load_dataset("mnist", root=tmp_path / "m")


def test_idx_size_mismatch_names_file_expected_and_got(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:-2]))
    with pytest.raises(ValueError, match=r"idx1-ubyte\.gz: expected 6 data bytes .*got 4"):
        load_dataset("mnist", root=tmp_path)


def test_corrupt_gzip_and_mismatched_counts(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "a")
    images = tmp_path / "a" / "t10k-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:30])  # truncated stream
    with pytest.raises(DatasetFormatError, match=r"idx3-ubyte\.gz: expected a valid gzip"):
        load_dataset("mnist", root=tmp_path / "a")
    write_mnist_like(tmp_path / "b")
    write_idx(tmp_path / "b" / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8), True)
    with pytest.raises(DatasetFormatError, match=r"expected 4 labels .*got 3"):
        load_dataset("mnist", root=tmp_path / "b")


def test_wrong_image_size_and_label_range_are_reported(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "small", size=10)
    with pytest.raises(DatasetFormatError, match=r"expected images of shape \(1, 28, 28\), got"):
        load_dataset("fashion_mnist", root=tmp_path / "small")
    write_mnist_like(tmp_path / "labels")
    write_idx(tmp_path / "labels" / "train-labels-idx1-ubyte.gz", np.full(6, 12, np.uint8), True)
    with pytest.raises(DatasetFormatError, match=r"expected labels in 0\.\.9, got 12\.\.12"):
        load_dataset("mnist", root=tmp_path / "labels")


# --------------------------------------------------------------------------- CIFAR


def write_cifar10(folder: Path, protocol: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        batches[name] = data
        batch = {b"data": data, b"labels": [1, 2, 3], b"batch_label": b"x", b"filenames": []}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    return batches


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_batches(tmp_path: Path, protocol: int) -> None:
    batches = write_cifar10(tmp_path / "cifar-10-batches-py", protocol, np.random.default_rng(1))
    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.train.x.shape == (15, 3, 32, 32) and ds.test.x.shape == (3, 3, 32, 32)
    assert ds.train.x.dtype == torch.float32 and ds.train.y.dtype == torch.int64
    assert ds.train.y.tolist() == [1, 2, 3] * 5 and ds.class_names[1] == "automobile"
    # row-major channel planes: pixel (c=1, h=2, w=3) is flat index 1*1024 + 2*32 + 3
    raw = batches["data_batch_2"][0, 1 * 1024 + 2 * 32 + 3]
    assert ds.train.x[3, 1, 2, 3].item() == pytest.approx((raw / 255 - 0.4822) / 0.2435, abs=1e-5)


def test_cifar100_fine_labels_and_names(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 4), ("test", 2)):
        data = np.full((n, 3072), 255, dtype=np.uint8)
        batch = {"data": data, "fine_labels": [99] * n, "coarse_labels": [0] * n}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": ["apple"]}))
    ds = load_dataset("cifar100", root=tmp_path)
    assert ds.num_classes == 100 and ds.train.y.tolist() == [99] * 4
    assert ds.class_names[0] == "apple" and ds.class_names[99] == "worm"
    mean, std = torch.tensor((0.5071, 0.4865, 0.4409)), torch.tensor((0.2673, 0.2564, 0.2762))
    torch.testing.assert_close(ds.test.x[1, :, 0, 0], (1 - mean) / std)


def test_cifar_batch_with_wrong_shape_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        batch = {"data": np.zeros((2, 100), np.uint8), "fine_labels": [0, 1]}
        (folder / name).write_bytes(pickle.dumps(batch))
    with pytest.raises(DatasetFormatError, match=r"train: expected 'data' as an array \[N, 3072\]"):
        load_dataset("cifar100", root=tmp_path)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _EvalEvil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, ("1 + 1",))


def test_malicious_pickle_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps({"data": _Evil(marker)}))
    with pytest.raises(DatasetFormatError, match=r"refusing to load (posix|nt|os)\.system"):
        load_dataset("cifar100", root=tmp_path)
    assert not marker.exists()


def test_restricted_unpickler_refuses_other_globals(tmp_path: Path) -> None:
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({"data": _EvalEvil()}))
    with pytest.raises(UnsafePickleError, match=r"refusing to load builtins\.eval"):
        read_cifar_batch(path)
    # _codecs.encode is allowed only as protocol 2 uses it for bytes: Latin-1
    path.write_bytes(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00rot_13\x86R.")
    with pytest.raises(UnsafePickleError, match="expected latin1"):
        read_cifar_batch(path)
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="expected a pickled dict, got list"):
        read_cifar_batch(path)
    path.write_bytes(pickle.dumps({"data": 1})[:-3])
    with pytest.raises(ValueError, match="expected a pickled CIFAR batch"):
        read_cifar_batch(path)


# --------------------------------------------------------------------------- SVHN, STL-10


def test_svhn_mat(tmp_path: Path) -> None:
    from scipy.io import savemat

    x = np.zeros((32, 32, 3, 5), dtype=np.uint8)
    x[4, 7, 2, 1] = 200  # row 4, column 7, channel 2, example 1
    y = np.array([[10], [1], [2], [3], [10]], dtype=np.uint8)
    for split in ("train", "test"):
        savemat(tmp_path / f"{split}_32x32.mat", {"X": x, "y": y})
    ds = load_dataset("svhn", root=tmp_path)
    assert ds.train.x.shape == (5, 3, 32, 32) and ds.train.x.dtype == torch.float32
    assert ds.train.y.tolist() == [0, 1, 2, 3, 0]  # label 10 means digit 0
    raw = ds.train.x[1, 2] * 0.1970 + 0.4728
    assert raw[4, 7].item() == pytest.approx(200 / 255, abs=1e-5)
    assert raw.abs().sum().item() == pytest.approx(200 / 255, abs=1e-3)


def test_svhn_bad_shape(tmp_path: Path) -> None:
    from scipy.io import savemat

    (tmp_path / "SVHN").mkdir()
    for split in ("train", "test"):
        savemat(
            tmp_path / "SVHN" / f"{split}_32x32.mat",
            {"X": np.zeros((28, 28, 3, 2), np.uint8), "y": np.ones((2, 1), np.uint8)},
        )
    with pytest.raises(DatasetFormatError, match=r"expected X of shape \(32, 32, 3, 2\)"):
        load_dataset("svhn", root=tmp_path)


def test_stl10_binary_is_column_major(tmp_path: Path) -> None:
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    images = np.zeros((2, 3, 96, 96), dtype=np.uint8)  # stored as [N, C, W, H]
    images[1, 0, 10, 20] = 255  # column 10, row 20
    for split in ("train", "test"):
        images.tofile(folder / f"{split}_X.bin")
        np.array([1, 10], dtype=np.uint8).tofile(folder / f"{split}_y.bin")
    ds = load_dataset("stl10", root=tmp_path)
    assert ds.train.x.shape == (2, 3, 96, 96) and ds.train.y.tolist() == [0, 9]
    row, col = divmod(int(ds.train.x[1, 0].argmax()), 96)
    assert (row, col) == (20, 10)
    assert ds.train.x[1, 0, 20, 10].item() == pytest.approx((1 - 0.4467) / 0.2603, abs=1e-5)


def test_stl10_bad_labels(tmp_path: Path) -> None:
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    for split in ("train", "test"):
        np.zeros((2, 3, 96, 96), np.uint8).tofile(folder / f"{split}_X.bin")
        np.array([0, 3], dtype=np.uint8).tofile(folder / f"{split}_y.bin")
    with pytest.raises(
        DatasetFormatError, match=r"train_y\.bin: expected labels in 1\.\.10, got 0"
    ):
        load_dataset("stl10", root=tmp_path)


# --------------------------------------------------------------------------- digits, registry


def test_digits_has_a_fixed_split() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    assert a.train.x.shape == (1438, 1, 8, 8) and a.test.x.shape == (359, 1, 8, 8)
    torch.testing.assert_close(a.test.x, b.test.x)
    torch.testing.assert_close(a.train.y, b.train.y)
    np.random.seed(0)  # experiment RNG state plays no part
    torch.manual_seed(123)
    torch.testing.assert_close(load_dataset("digits").test.y, a.test.y)
    counts = np.bincount(a.test.y.numpy(), minlength=10)
    assert counts.min() >= 30  # stratified: every class ~20% in test
    assert DIGITS_SPLIT_SEED == 20_250_101
    assert abs(a.train.x.mean().item()) < 0.1 and abs(a.train.x.std().item() - 1) < 0.1


def test_digits_read_without_scikit_learn_equal_load_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The digits file read directly gives exactly ``load_digits``'s arrays, and the fallback
    through ``load_digits`` (where the file is not found) gives the same."""
    from sklearn.datasets import load_digits

    from oneshotfl.data import catalog

    bunch = load_digits()
    images, target = catalog._digits_arrays()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)
    monkeypatch.setattr(catalog.importlib.util, "find_spec", lambda name: None)
    images, target = catalog._digits_arrays()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)


def test_loading_digits_does_not_import_scikit_learn() -> None:
    """A fresh process (a Flower node's, say) loads digits without paying for scikit-learn."""
    code = (
        "import sys; from oneshotfl.data.datasets import load_dataset; load_dataset('digits'); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_registry_lists_every_dataset() -> None:
    assert list_datasets() == sorted(
        ["cifar10", "cifar100", "digits", "fashion_mnist", "mnist", "stl10", "svhn"]
    )
    for name in list_datasets():
        spec = DATASETS.get(name)
        assert len(spec.mean) == len(spec.std) == spec.image_shape[0]


def test_missing_dataset_says_where_it_looked_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONESHOTFL_DATA", str(tmp_path / "env"))
    system = tmp_path / "system"
    spec = dataclasses.replace(DATASETS.get("fashion_mnist"), system_dirs=(str(system),))

    def get(name: str) -> DatasetSpec:
        return spec

    monkeypatch.setattr(DATASETS, "get", get)
    (tmp_path / "nowhere").mkdir()  # an empty root (a missing one is its own error)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion_mnist", root=tmp_path / "nowhere")
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for place in (tmp_path / "nowhere", tmp_path / "env", system):
        assert str(place) in message
    assert "FashionMNIST/raw/" in message
    assert "apt-get install -y dataset-fashion-mnist" in message
    assert "--data-root DIR" in message and "--download" in message
    assert ". " not in message  # one sentence


def test_missing_cifar_without_any_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"no directory .*--download"):
        load_dataset("cifar10")
    with pytest.raises(DatasetNotFoundError, match="cifar-10-batches-py"):
        load_dataset("cifar10", root=tmp_path)


@pytest.mark.skipif(not FMNIST_SYSTEM.exists(), reason="Debian's dataset-fashion-mnist absent")
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion_mnist")
    assert len(ds.train) == 60_000 and len(ds.test) == 10_000
    assert ds.train.x.shape[1:] == (1, 28, 28) and ds.train.x.dtype == torch.float32
    assert set(ds.train.y.unique().tolist()) == set(range(10))
    assert abs(ds.train.x.mean().item()) < 0.01 and abs(ds.train.x.std().item() - 1) < 0.01
