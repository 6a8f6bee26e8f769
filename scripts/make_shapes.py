"""Write ``shapes16``: a synthetic 10-class, 16x16 RGB image dataset as an npz file.

The robustness matrix (``make bench-robustness``) runs every method on it beside digits and a
Fashion-MNIST subset, through the npz loader a user's own data goes through
(``--dataset npz:path=F``). Each image is one shape — disc, ring, filled square, square
outline, horizontal bar, vertical bar, plus, X, triangle, two dots (labels 0–9 in that order)
— at a random centre and size, in a random bright colour on a random dark background, with
Gaussian pixel noise. Colour says nothing about the class and position varies, so a model has
to learn shapes: a third image size and the only three-channel data in the matrix.

Usage: python scripts/make_shapes.py OUT.npz [--train 4000] [--test 1000] [--seed 0]
(same arguments, same bytes: every draw comes from one seeded numpy generator).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SIDE = 16
CLASSES = (
    "disc",
    "ring",
    "square",
    "outline",
    "hbar",
    "vbar",
    "plus",
    "cross",
    "triangle",
    "dots",
)


def shape_mask(kind: int, cy: float, cx: float, r: float) -> np.ndarray:
    """The ``[SIDE, SIDE]`` boolean mask of shape ``kind`` centred at (cy, cx), size ``r``."""
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64)
    dy, dx = yy - cy, xx - cx
    dist = np.hypot(dy, dx)
    box = np.maximum(np.abs(dy), np.abs(dx))
    width = max(1.0, r / 3)
    name = CLASSES[kind]
    if name == "disc":
        return dist <= r
    if name == "ring":
        return (dist <= r) & (dist >= r - width)
    if name == "square":
        return box <= r * 0.85
    if name == "outline":
        return (box <= r * 0.85) & (box >= r * 0.85 - width)
    if name == "hbar":
        return (np.abs(dy) <= width / 2 + 0.5) & (np.abs(dx) <= r)
    if name == "vbar":
        return (np.abs(dx) <= width / 2 + 0.5) & (np.abs(dy) <= r)
    if name == "plus":
        arm = width / 2 + 0.5
        return ((np.abs(dy) <= arm) | (np.abs(dx) <= arm)) & (box <= r)
    if name == "cross":
        arm = (width / 2 + 0.5) * np.sqrt(2)
        return ((np.abs(dy - dx) <= arm) | (np.abs(dy + dx) <= arm)) & (box <= r * 0.85)
    if name == "triangle":  # apex up: the half-width grows from the apex to the base
        top, base = cy - r * 0.85, cy + r * 0.85
        half = (yy - top) / (base - top) * r
        return (yy >= top) & (yy <= base) & (np.abs(dx) <= half)
    gap = r * 0.6  # two dots side by side
    small = max(1.2, r * 0.4)
    return (np.hypot(dy, dx - gap) <= small) | (np.hypot(dy, dx + gap) <= small)


def make_split(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images, ``[n, 3, SIDE, SIDE]`` uint8, with balanced labels in a random order."""
    y = rng.permutation(np.arange(n) % len(CLASSES)).astype(np.int64)
    x = np.empty((n, 3, SIDE, SIDE), dtype=np.uint8)
    for i, kind in enumerate(y):
        r = rng.uniform(3.0, 5.5)
        cy, cx = rng.uniform(r * 0.9, SIDE - 1 - r * 0.9, size=2)
        background = rng.uniform(0.0, 0.45, size=3)
        foreground = rng.uniform(0.55, 1.0, size=3)
        mask = shape_mask(int(kind), cy, cx, r)
        image = np.where(mask[None], foreground[:, None, None], background[:, None, None])
        image = image + rng.normal(0.0, 0.08, size=image.shape)
        x[i] = np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    x, y = make_split(args.train, rng)
    x_test, y_test = make_split(args.test, rng)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out, x=x, y=y, x_test=x_test, y_test=y_test, class_names=np.array(CLASSES)
    )
    print(f"make_shapes: {args.out} ({args.train} train, {args.test} test, {SIDE}x{SIDE} RGB)")


if __name__ == "__main__":
    main()
