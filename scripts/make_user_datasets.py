"""Write the four "bring your own data" datasets a new user tried (issue 36), into one folder.

* ``breast_cancer.csv`` — scikit-learn's ``load_breast_cancer`` (569 rows, 30 raw features on
  scales from 0.001 to 4 000, header row, label column ``label`` last): a table as a user
  exports it, unscaled (the CSV loader standardises it on the training split).
* ``classification.npz`` — ``make_classification`` (3 000 rows, 20 features of which 8
  informative, 4 classes, features shifted and scaled per column so that they are not
  standardised): a table as an ``[N, D]`` npz.
* ``gratings32/`` — an image folder (one subfolder per class, PNG files): 32×32 RGB oriented
  sinusoidal gratings, 6 classes (orientation 0°, 30°, …, 150°), random spatial frequency,
  phase and two random colours per image, Gaussian noise; 200 images per class.
* ``grey20x28.npz`` — 20×28 grey images (``x`` ``[N, 20, 28]`` uint8; the loader pads them to
  28×28): 5 classes of stripe patterns (1 to 5 horizontal stripes of random width and
  contrast), noise, 2 000 images.

Usage: python scripts/make_user_datasets.py OUT_DIR [--seed 0]. Same arguments, same files:
every draw comes from one seeded numpy generator.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_breast_cancer, make_classification


def breast_cancer_csv(path: Path) -> None:
    """The breast-cancer table as a CSV file with a header, label last (0 malignant)."""
    data = load_breast_cancer()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(n.replace(" ", "_") for n in data.feature_names), "label"])
        for row, label in zip(data.data, data.target, strict=True):
            writer.writerow([*(f"{v:.6g}" for v in row), int(label)])


def classification_npz(path: Path, rng: np.random.Generator) -> None:
    """A 4-class ``make_classification`` table, each feature on its own scale and offset."""
    x, y = make_classification(
        n_samples=3000,
        n_features=20,
        n_informative=8,
        n_redundant=4,
        n_classes=4,
        n_clusters_per_class=2,
        random_state=int(rng.integers(2**31)),
    )
    scale = 10.0 ** rng.uniform(-2, 3, size=x.shape[1])
    offset = rng.normal(0, 100, size=x.shape[1])
    np.savez(path, x=(x * scale + offset).astype(np.float32), y=y.astype(np.int64))


def grating(rng: np.random.Generator, angle: float, side: int) -> np.ndarray:
    """One ``[side, side]`` grating in [0, 1] at ``angle`` radians."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float64) / side
    cycles = rng.uniform(2.0, 5.0)
    u = xx * np.cos(angle) + yy * np.sin(angle)
    return 0.5 + 0.5 * np.sin(2 * np.pi * cycles * u + rng.uniform(0, 2 * np.pi))


def gratings_folder(root: Path, rng: np.random.Generator, per_class: int = 200) -> None:
    """32×32 RGB gratings, one subfolder per orientation class."""
    side, classes = 32, 6
    for k in range(classes):
        folder = root / f"angle{30 * k:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            g = grating(rng, np.pi * k / classes + rng.normal(0, 0.05), side)[..., None]
            a, b = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3)
            img = g * a + (1 - g) * b + rng.normal(0, 0.1, (side, side, 3))
            pixels = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(folder / f"{i:04d}.png")


def stripes_npz(path: Path, rng: np.random.Generator, n: int = 2000) -> None:
    """20×28 grey images of 1 to 5 horizontal stripes (class = stripes − 1)."""
    height, width, classes = 20, 28, 5
    x = np.empty((n, height, width), dtype=np.uint8)
    y = rng.integers(0, classes, size=n)
    rows = np.arange(height)[:, None]
    for i in range(n):
        img = np.full((height, width), rng.uniform(0, 0.3))
        centres = np.sort(rng.choice(np.arange(2, height - 1, 3), size=y[i] + 1, replace=False))
        for c in centres:
            half = rng.uniform(0.6, 1.4)
            img += rng.uniform(0.4, 0.7) * (np.abs(rows - c) <= half)
        img = img + rng.normal(0, 0.08, img.shape)
        x[i] = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    np.savez(path, x=x, y=y.astype(np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    breast_cancer_csv(args.out / "breast_cancer.csv")
    classification_npz(args.out / "classification.npz", rng)
    gratings_folder(args.out / "gratings32", rng)
    stripes_npz(args.out / "grey20x28.npz", rng)
    print(f"wrote breast_cancer.csv, classification.npz, gratings32/, grey20x28.npz in {args.out}")


if __name__ == "__main__":
    main()
