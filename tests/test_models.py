"""The model zoo: every registered architecture honours the classifier contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oneshotfl.models import MODELS, ClassifierModel, create_model, list_models
from oneshotfl.registry import RegistryError

ALL_MODELS = list_models()
NUM_CLASSES = 7
BATCH = 2
# (in_channels, image_size): sklearn digits, MNIST/Fashion-MNIST, CIFAR/SVHN.
SMALL_INPUTS = [(1, 8), (1, 28), (3, 32)]
STL_MODELS = ["cnn", "resnet8", "vgg"]  # 3x96x96 (STL-10) for a few, to stay fast


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def _check_contract(name: str, in_channels: int, image_size: int) -> None:
    model = create_model(name, in_channels, NUM_CLASSES, image_size).eval()
    x = torch.randn(BATCH, in_channels, image_size, image_size)
    with torch.no_grad():
        logits = model(x)
        features = model.forward_features(x)
        assert features.shape == (BATCH, model.num_features)
        assert model.forward_head(features, pre_logits=True) is features
        torch.testing.assert_close(model.forward_head(features), logits)
    assert logits.shape == (BATCH, NUM_CLASSES)
    assert torch.isfinite(logits).all()


def test_registry_is_populated() -> None:
    expected = {
        "mlp",
        "cnn",
        "fedavg_cnn",
        "resnet8",
        "resnet11",
        "resnet20",
        "resnet56",
        "mobilenetv2",
        "vgg",
    }
    assert expected <= set(ALL_MODELS)
    assert ALL_MODELS == sorted(ALL_MODELS) == MODELS.names()
    assert all(entry.description for entry in MODELS.entries())


@pytest.mark.parametrize(("in_channels", "image_size"), SMALL_INPUTS)
@pytest.mark.parametrize("name", ALL_MODELS)
def test_contract_small_images(name: str, in_channels: int, image_size: int) -> None:
    _check_contract(name, in_channels, image_size)


@pytest.mark.parametrize("name", STL_MODELS)
def test_contract_stl10_size(name: str) -> None:
    _check_contract(name, 3, 96)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_records_how_it_was_built(name: str) -> None:
    model = create_model(name, 3, NUM_CLASSES, 32)
    assert isinstance(model, ClassifierModel)
    assert model.arch == name
    assert (model.in_channels, model.num_classes, model.image_size) == (3, NUM_CLASSES, 32)
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == model.num_features
    assert model.head.out_features == NUM_CLASSES


@pytest.mark.parametrize("name", ALL_MODELS)
def test_arch_round_trips_through_create_model(name: str) -> None:
    model = create_model(name, 1, NUM_CLASSES, 28)
    again = create_model(model.arch, model.in_channels, model.num_classes, model.image_size)
    a, b = model.state_dict(), again.state_dict()
    assert list(a) == list(b)
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    again.load_state_dict(a)  # strict: the same architecture


def test_same_seed_same_weights() -> None:
    torch.manual_seed(1)
    a = create_model("cnn", 1, NUM_CLASSES, 8)
    torch.manual_seed(1)
    b = create_model("cnn", 1, NUM_CLASSES, 8)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        assert torch.equal(va, vb)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_builds_on_meta_device(name: str) -> None:
    with torch.device("meta"):  # the wire layer builds reference shapes this way
        model = create_model(name, 3, NUM_CLASSES, 32)
    assert all(p.is_meta for p in model.parameters())


def test_shapes_on_meta_draw_nothing_so_they_leave_torchs_compiler_unloaded() -> None:
    """The wire layer sizes every allowed architecture on the meta device in every Flower
    node and server process; a normal draw on meta tensors imports torch._dynamo (about 2 s of
    CPU in a fresh process) for values that do not exist."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from oneshotfl.models import list_models\n"
        "from oneshotfl.models.base import create_model\n"
        "with torch.device('meta'):\n"
        "    for name in list_models():\n"
        "        create_model(name, 3, 10, 32)\n"
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(RegistryError) as info:
        create_model("resnet9000", 3, 10, 32)
    message = str(info.value)
    assert "resnet9000" in message
    for name in ALL_MODELS:
        assert name in message


def test_duplicate_registration_raises() -> None:
    before = MODELS.entries()
    with pytest.raises(RegistryError, match="already registered"):
        MODELS.register("mlp", "a second mlp")(MODELS.get("mlp"))
    assert MODELS.entries() == before


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize("num_classes", [0, -3])
def test_bad_num_classes_raises(name: str, num_classes: int) -> None:
    with pytest.raises(ValueError, match=r"num_classes >= 1, got -?\d+") as info:
        create_model(name, 1, num_classes, 28)
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "too_small"),
    [("cnn", 3), ("fedavg_cnn", 2), ("resnet20", 3), ("mobilenetv2", 7), ("vgg", 4), ("mlp", 0)],
)
def test_image_too_small_raises(name: str, too_small: int) -> None:
    with pytest.raises(ValueError, match=rf"image_size >= \d+, got {too_small}"):
        create_model(name, 1, 10, too_small)


@pytest.mark.parametrize("bad", [2.5, "28", True, None])
def test_non_integer_sizes_raise(bad: object) -> None:
    with pytest.raises(ValueError, match="integer"):
        create_model("mlp", 1, 10, bad)  # type: ignore[arg-type]


def test_bad_in_channels_raises() -> None:
    with pytest.raises(ValueError, match="in_channels >= 1, got 0"):
        create_model("resnet8", 0, 10, 32)


def test_published_parameter_counts() -> None:
    # McMahan et al. (2017) report 199,210 (2NN) and 1,663,370 (CNN) parameters on MNIST.
    def count(name: str) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in create_model(name, 1, 10, 28).parameters())

    assert count("mlp") == 199_210
    assert count("fedavg_cnn") == 1_663_370


def test_head_can_be_swapped() -> None:
    model = create_model("resnet8", 3, NUM_CLASSES, 32).eval()
    model.head = nn.Linear(model.num_features, 3)
    with torch.no_grad():
        assert model(torch.randn(BATCH, 3, 32, 32)).shape == (BATCH, 3)
