"""Feature skew: each client in its own domain, the pool and the test split a seeded mixture,
the same on every preparation (and so on a Flower node), clear errors for bad specs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from helpers import prepare
from oneshotfl.data.feature_skew import PALETTE, RGB, Domains, Stats, build_feature_skew
from oneshotfl.runner.config import ConfigError


def test_color_paints_each_client_in_its_own_colours(tiny_config: Any) -> None:
    exp = prepare(tiny_config(feature_skew="color", public_size=50))
    data = exp.data
    assert data.task.in_channels == 3 and data.test.x.shape[1] == 3
    assert data.public is not None and data.public.x.shape[1] == 3
    for shard in data.clients:
        fg, bg = (torch.tensor(RGB[c]) for c in PALETTE[shard.client_id])
        pixels = shard.train.x.permute(0, 2, 3, 1).reshape(-1, 3) * 0.5 + 0.5  # in [0, 1]
        # every pixel lies on the segment from the background to the foreground colour
        t = ((pixels - bg) @ (fg - bg)) / float((fg - bg) @ (fg - bg))
        on_segment = bg + t.unsqueeze(1) * (fg - bg)
        assert torch.allclose(pixels, on_segment, atol=1e-5)
    again = prepare(tiny_config(feature_skew="color", public_size=50)).data
    assert torch.equal(again.test.x, data.test.x)  # the test mixture is seeded


def test_binary_colour_uses_only_the_two_colours() -> None:
    skew = build_feature_skew("color:binary=true")
    x = torch.rand(4, 1, 6, 6)
    where = Domains(np.array([0, 1, 2, 3]), 4, Stats((0.0,), (1.0,)), "t", 0)
    out = skew.apply(x, where) * 0.5 + 0.5
    for i in range(4):
        colours = {
            tuple(round(v, 4) for v in p) for p in out[i].permute(1, 2, 0).reshape(-1, 3).tolist()
        }
        assert colours <= {tuple(round(v, 4) for v in RGB[c]) for c in PALETTE[i]}


def test_rotation_and_noise_grow_with_the_client_index() -> None:
    x = torch.rand(3, 1, 8, 8)
    where = Domains(np.array([0, 1, 2]), 3, Stats((0.0,), (1.0,)), "t", 0)
    rotated = build_feature_skew("rotation:max_degrees=180").apply(x, where)
    assert torch.allclose(rotated[0], x[0], atol=1e-5)  # client 0: no rotation
    assert torch.allclose(rotated[2], x[2].flip(-1).flip(-2), atol=1e-4)  # 180°
    noisy = build_feature_skew("noise:max_std=2").apply(x, where)
    assert torch.equal(noisy[0], x[0])
    assert float((noisy[2] - x[2]).std()) > float((noisy[1] - x[1]).std()) > 0


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("tint", "unknown feature skew"),
        ("rotation:max_degrees=0", "max_degrees"),
        ("color:shade=3", "shade"),
    ],
)
def test_a_bad_feature_skew_is_a_one_line_config_error(
    tiny_config: Any, spec: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        prepare(tiny_config(feature_skew=spec))
