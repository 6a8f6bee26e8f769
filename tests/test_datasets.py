"""Dataset loaders, each tested on tiny files written here in that dataset's real format."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from oneshotfl.data.datasets import (
    DATASETS,
    DatasetFormatError,
    DatasetNotFoundError,
    load_dataset,
    search_dirs,
)
from oneshotfl.data.formats import read_idx

FMNIST_SYSTEM = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_mnist_like(
    folder: Path, n_train: int = 6, n_test: int = 4, compress: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    y = (np.arange(n_train) % 10).astype(np.uint8)
    suffix = ".gz" if compress else ""
    write_idx(folder / f"train-images-idx3-ubyte{suffix}", x, compress)
    write_idx(folder / f"train-labels-idx1-ubyte{suffix}", y, compress)
    write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", x[:n_test], compress)
    write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", y[:n_test], compress)
    return x, y


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_idx(tmp_path: Path, compress: bool) -> None:
    x, y = write_mnist_like(tmp_path / "fashion_mnist", compress=compress)
    data = load_dataset("fashion_mnist", root=tmp_path)
    assert data.train.x.shape == (6, 1, 28, 28) and data.train.x.dtype == torch.float32
    assert data.test.x.shape == (4, 1, 28, 28) and data.train.y.dtype == torch.int64
    np.testing.assert_array_equal(data.train.y.numpy(), y)
    # normalisation: (x/255 - 0.2860) / 0.3530
    expected = (x[2, 5, 7] / 255.0 - 0.2860) / 0.3530
    assert data.train.x[2, 0, 5, 7].item() == pytest.approx(expected, abs=1e-5)
    assert data.num_classes == 10 and data.class_names[0] == "T-shirt/top"


def test_mnist_torchvision_layout(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "MNIST" / "raw")
    data = load_dataset("mnist", root=tmp_path)
    assert len(data.train) == 6 and data.in_channels == 1 and data.image_size == 28


def test_environment_variable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist_like(tmp_path)
    monkeypatch.setenv("ONESHOTFL_DATA", str(tmp_path))
    assert len(load_dataset("mnist").train) == 6


def test_cifar10_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(1)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        batches[name] = data
        with (folder / name).open("wb") as fh:
            pickle.dump({b"data": data, b"labels": [1, 2, 3], b"batch_label": b"x"}, fh)
    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.train.x.shape == (15, 3, 32, 32) and ds.test.x.shape == (3, 3, 32, 32)
    assert ds.train.y.tolist() == [1, 2, 3] * 5
    # row-major channel planes: pixel (c=1, h=2, w=3) is flat index 1*1024 + 2*32 + 3
    raw = batches["data_batch_1"][0, 1 * 1024 + 2 * 32 + 3]
    assert ds.train.x[0, 1, 2, 3].item() == pytest.approx((raw / 255 - 0.4822) / 0.2435, abs=1e-5)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 4), ("test", 2)):
        data = np.zeros((n, 3072), dtype=np.uint8)
        with (folder / name).open("wb") as fh:
            pickle.dump({"data": data, "fine_labels": [99] * n, "coarse_labels": [0] * n}, fh)
    ds = load_dataset("cifar100", root=tmp_path)
    assert ds.num_classes == 100 and ds.train.y.tolist() == [99] * 4


def test_malicious_pickle_is_refused(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo pwned > pwned.txt",))

    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps({"data": Evil()}))
    with pytest.raises(DatasetFormatError, match="refusing to load"):
        load_dataset("cifar100", root=tmp_path)
    assert not Path("pwned.txt").exists()


def test_svhn_mat(tmp_path: Path) -> None:
    from scipy.io import savemat

    x = np.zeros((32, 32, 3, 5), dtype=np.uint8)
    x[4, 7, 2, 1] = 200  # H=4, W=7, channel 2, example 1
    y = np.array([[10], [1], [2], [3], [10]], dtype=np.uint8)
    for split in ("train", "test"):
        savemat(tmp_path / f"{split}_32x32.mat", {"X": x, "y": y})
    ds = load_dataset("svhn", root=tmp_path)
    assert ds.train.x.shape == (5, 3, 32, 32)
    assert ds.train.y.tolist() == [0, 1, 2, 3, 0]  # label 10 means digit 0
    raw = ds.train.x[1, 2] * 0.1970 + 0.4728
    assert raw[4, 7].item() == pytest.approx(200 / 255, abs=1e-5)
    assert raw.abs().sum().item() == pytest.approx(200 / 255, abs=1e-3)


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


def test_digits_has_a_fixed_split() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    assert a.train.x.shape[1:] == (1, 8, 8) and len(a.train) + len(a.test) == 1797
    torch.testing.assert_close(a.test.x, b.test.x)
    counts = np.bincount(a.test.y.numpy(), minlength=10)
    assert counts.min() >= 30  # stratified: every class ~20% in test


def test_missing_dataset_says_where_it_looked_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cifar10", root=tmp_path / "nowhere")
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and "--download" in message


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
    assert "apt-get install -y dataset-fashion-mnist" in spec.hint


def test_corrupt_idx_files_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "x.gz"
    bad.write_bytes(gzip.compress(b"\x01\x02\x03\x04rest"))
    with pytest.raises(ValueError, match="expected an IDX file"):
        read_idx(bad)
    write_mnist_like(tmp_path / "m")
    labels = tmp_path / "m" / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:-2]))
    with pytest.raises(DatasetFormatError, match="data bytes"):
        load_dataset("mnist", root=tmp_path / "m")


@pytest.mark.skipif(not FMNIST_SYSTEM.exists(), reason="Debian's dataset-fashion-mnist absent")
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion_mnist")
    assert len(ds.train) == 60_000 and len(ds.test) == 10_000
    assert ds.train.x.shape[1:] == (1, 28, 28)
    assert abs(ds.train.x.mean().item()) < 0.01 and abs(ds.train.x.std().item() - 1) < 0.01
