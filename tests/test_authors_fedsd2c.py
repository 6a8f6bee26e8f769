"""The authors' FedSD2C pieces, as ``benchmarks/authors/fedsd2c_authors.py`` loads them (their
definitions unedited), agree with ours on small inputs — the Fourier amplitude mix, the
V-information core-set, the autoencoder behind their ``AutoencoderKL`` — and the plugin runs
their client and server steps on a tiny federation. It needs a checkout named by
``FEDSD2C_REPO`` and is skipped, naming it, without one."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import run_config
from oneshotfl.data.types import TaskInfo
from oneshotfl.encoders.autoencoder import build_autoencoder
from oneshotfl.methods import parse_method_spec
from oneshotfl.methods.fedsd2c import apply_crops, crop_boxes, fourier_amplitude_mix, vinfo_coreset
from oneshotfl.models import create_model
from test_authors_dedes_regmean import authors_plugin

CHECKOUT = ("FEDSD2C_REPO", "Carkham/FedSD2C")
PLUGIN = Path(__file__).resolve().parents[1] / "benchmarks" / "authors" / "fedsd2c_authors.py"
TASK = TaskInfo("digits", 10, 1, 8)
TINY = "ipc=5:iterations=3:server_epochs=2:ae_width=8:ae_min_steps=50"


@pytest.fixture
def mod(forget: list[str], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return authors_plugin("fedsd2c_authors", CHECKOUT, forget, monkeypatch)


def test_their_fourier_mix_is_ours(mod: ModuleType) -> None:
    """Their ``colorful_spectrum_mix`` (NumPy, [C, H, W], the whole spectrum) gives, as its
    first image, our x_p at λ = 0.8, on random arrays of even and odd sides."""
    mix = mod.their_util(TASK)["colorful_spectrum_mix"]
    rng = np.random.default_rng(0)
    for shape in ((3, 8, 8), (1, 28, 28), (3, 7, 9)):
        x_s, x_d = rng.normal(size=shape), rng.normal(size=shape)
        theirs, _ = mix(x_s, x_d, 0.8)
        ours = fourier_amplitude_mix(
            torch.from_numpy(x_s).float(), torch.from_numpy(x_d).float(), 0.8
        )
        assert theirs.shape == shape
        assert np.abs(theirs - ours.numpy()).max() <= 1e-5


def test_their_coreset_selection_is_ours(mod: ModuleType) -> None:
    """Their ``selector_coreset`` on the same crops and model selects what
    :func:`vinfo_coreset` selects — the same examples, their best crops, the same
    cross-entropies — on our 1-channel model and through the 3-channel ``ConvNet`` adapter."""
    select = mod.their_util(TASK)["selector_coreset"]
    torch.manual_seed(0)
    model = create_model("cnn", 1, 10, 8).eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1, 8, 8, generator=gen)
    crops = apply_crops(x, crop_boxes(6, 0.08, gen))  # [40, 6, 1, 8, 8]
    labels = torch.full((40,), 3)
    with torch.no_grad():
        ce = F.cross_entropy(
            model(crops.flatten(0, 1)), labels.repeat_interleave(6), reduction="none"
        )
    chosen, best_crop, best_ce = vinfo_coreset(ce.view(40, 6), 12)
    grey = mod.Distiller(model, grey=True)
    for net, images in ((model, crops), (grey, crops.repeat(1, 1, 3, 1, 1))):
        out = select(12, net, images, labels, 8, torch.device("cpu"), m=6, ret_all=True)
        kept, dists, rest, rest_dists, _, indices = out
        assert indices.tolist() == chosen.tolist()
        assert torch.equal(kept, images[chosen, best_crop[chosen]])
        assert torch.allclose(dists, best_ce[chosen], atol=1e-5)
        others = torch.sort(best_ce[torch.isin(torch.arange(40), chosen, invert=True)]).values
        assert torch.allclose(rest_dists, others, atol=1e-5) and len(rest) == 28


def test_their_autoencoder_calls_reach_the_shared_autoencoder(mod: ModuleType) -> None:
    """``encode`` of their ``denormalize`` (ImageNet constants) is our encoding of the
    normalised image; their ``Normalize`` of ``decode(z).sample`` is our decoding, ×3."""
    code = mod.authors_code(TASK)
    auto = build_autoencoder("public:downsample=2:width=8:min_steps=20", TASK, 0,
                             public=torch.randn(32, 1, 8, 8))  # fmt: skip
    vae = mod.SharedAutoencoder(auto, grey=True).from_pretrained("stabilityai/sdxl-vae")
    x = (torch.rand(5, 1, 8, 8) - 0.3) / 0.38  # digits' pixels, normalised
    z = vae.encode(code["denormalize"](x.repeat(1, 3, 1, 1))).latent_dist.mode()
    assert torch.allclose(z, auto.model.encode(x), atol=1e-5)
    mean, std = (torch.tensor(code[k][mod.DATASET]).view(1, 3, 1, 1) for k in ("means", "stds"))
    back = (vae.decode(z).sample - mean) / std  # their Normalize
    assert torch.allclose(back, auto.model.decode(z).repeat(1, 3, 1, 1), atol=1e-5)
    assert vae.loaded == ["stabilityai/sdxl-vae"]


def test_a_tiny_run_of_their_steps_reports_the_final_model(
    mod: ModuleType, tiny_config: Any
) -> None:
    """Digits, 3 clients, ``fedsd2c`` beside the plugin with the same knobs: their steps run
    on our clients' data and models, and the run scores their final model."""
    authors, ours = f"fedsd2c_authors:{TINY}", f"fedsd2c:small_classes=drop:{TINY}"
    cfg = tiny_config(plugins=[str(PLUGIN)], methods=[ours, authors], model="cnn", public_size=200)
    rows = {m["key"]: m for m in run_config(cfg)["methods"]}
    row, mine = rows[parse_method_spec(authors).key], rows[parse_method_spec(ours).key]
    info = row["diagnostics"]
    assert 0.0 <= row["accuracy"] <= 1.0 and info["clients_used"] == 3
    assert 0 < info["distillates"] <= 3 * 5 * 10 and info["distillates"] % 5 == 0
    assert abs(row["accuracy"] - info["authors_final_test_accuracy"]) <= 1 / 359 + 1e-9
    assert info["authors_max_test_accuracy_selected_on_test"] >= info["authors_final_test_accuracy"]
    assert info["authors_max_test_accuracy_epoch"] in (1.0, 2.0)
    assert np.isfinite(info["authors_final_train_loss"])
    assert info["distillates"] == mine["diagnostics"]["distillates"]  # ipc a class held > ipc
