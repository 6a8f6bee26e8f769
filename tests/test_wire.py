"""The wire: safetensors round trips, byte counts, and rejection of malformed payloads."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from oneshotfl.models import create_model, list_models
from oneshotfl.payload import Payload, WireError, decode, encode
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.spec import (
    ArraySpec,
    ModelSpec,
    PayloadError,
    PayloadSpec,
    ScalarSpec,
    WireDims,
)
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.protocol.wire import receive, transmit

DIMS = WireDims(num_classes=10, in_channels=1, image_size=8, public_size=5)
PROBS = PayloadSpec(
    arrays=(ArraySpec("probs", ("N_pub", "C"), ("float32", "float16"), (0, 1), simplex=True),),
    scalars=(ScalarSpec("n_examples", int, 1),),
)


def probs_payload(n: int = 5, c: int = 10) -> Payload:
    p = np.full((n, c), 1.0 / c, dtype=np.float32)
    return Payload({"probs": p}, {"n_examples": 7})


def test_round_trip_keeps_arrays_scalars_and_dtypes() -> None:
    payload = Payload(
        {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones(4, dtype=np.float16)},
        {"n": 3, "x": 0.5, "name": "cnn", "flag": True},
    )
    back = decode(encode(payload))
    assert set(back.arrays) == {"a", "b"}
    assert back.arrays["a"].dtype == np.int64 and back.arrays["b"].dtype == np.float16
    np.testing.assert_array_equal(back.arrays["a"], payload.arrays["a"])
    assert dict(back.scalars) == {"n": 3, "x": 0.5, "name": "cnn", "flag": True}


def test_byte_count_is_the_encoded_size_and_grows_with_the_data() -> None:
    _, n_small = transmit(probs_payload(), PROBS, DIMS, 0)
    assert n_small == len(encode(probs_payload()))
    big_dims = WireDims(10, 1, 8, public_size=500)
    _, n_big = transmit(probs_payload(500), PROBS, big_dims, 0)
    # 495 more rows of 10 float32 values
    assert n_big - n_small == 495 * 10 * 4


def test_zero_dim_arrays_keep_their_shape() -> None:
    back = decode(encode(Payload({"count": np.array(7, dtype=np.int64), "v": np.ones(1)})))
    assert back.arrays["count"].shape == () and int(back.arrays["count"]) == 7
    assert back.arrays["v"].shape == (1,)


@pytest.mark.parametrize("arch", list_models())
def test_model_round_trip_reproduces_outputs(arch: str) -> None:
    torch.manual_seed(0)
    model = create_model(arch, 1, 10, 8).eval()
    spec = PayloadSpec(models=(ModelSpec(),))
    received, _ = transmit(model_fields(model), spec, DIMS, 3)
    rebuilt = model_from_fields(received, DIMS).eval()
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(rebuilt(x), model(x))


def test_pickle_bytes_are_refused_without_unpickling() -> None:
    evil = pickle.dumps({"probs": np.zeros((5, 10))})
    with pytest.raises(WireError, match="safetensors"):
        receive(evil, PROBS, DIMS, 1)


def test_truncated_bytes_are_refused() -> None:
    with pytest.raises(WireError):
        decode(encode(probs_payload())[:-7])


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        (
            Payload({"probs": np.full((5, 10), np.nan, np.float32)}, {"n_examples": 7}),
            "probs",
            "NaN",
        ),
        (
            Payload({"probs": np.full((4, 10), 0.1, np.float32)}, {"n_examples": 7}),
            "probs",
            "5 on axis 0",
        ),
        (
            Payload({"probs": np.full((5, 9), 1 / 9, np.float32)}, {"n_examples": 7}),
            "probs",
            "class count 10",
        ),
        (
            Payload({"probs": np.full((5, 10), 0.1, np.float64)}, {"n_examples": 7}),
            "probs",
            "dtype",
        ),
        (
            Payload({"probs": np.full((5, 10), 0.5, np.float32)}, {"n_examples": 7}),
            "probs",
            "summing to 1",
        ),
        (Payload({"probs": np.full((5, 10), 0.1, np.float32)}, {}), "n_examples", "missing"),
        (
            Payload({"probs": np.full((5, 10), 0.1, np.float32)}, {"n_examples": "7"}),
            "n_examples",
            "int",
        ),
        (
            Payload({"probs": np.full((5, 10), 0.1, np.float32)}, {"n_examples": 0}),
            "n_examples",
            ">= 1",
        ),
        (
            Payload(
                {"probs": np.full((5, 10), 0.1, np.float32), "extra": np.zeros(1, np.float32)},
                {"n_examples": 7},
            ),
            "extra",
            "unexpected",
        ),
        (Payload({}, {"n_examples": 7}), "probs", "missing"),
    ],
)
def test_malformed_payloads_are_rejected_naming_client_field_expected_got(
    payload: Payload, field: str, fragment: str
) -> None:
    with pytest.raises(PayloadError) as info:
        receive(encode(payload), PROBS, DIMS, client=4)
    message = str(info.value)
    assert info.value.client == 4 and info.value.field == field
    assert message.startswith("client 4: payload field")
    assert "expected" in message and "got" in message and fragment in message


def test_model_with_wrong_class_count_is_rejected() -> None:
    wrong = create_model("mlp", 1, 9, 8)
    with pytest.raises(PayloadError, match="class count") as info:
        validate_payload(model_fields(wrong), PayloadSpec(models=(ModelSpec(),)), DIMS, 2)
    assert info.value.field == "model.head.weight"


def test_model_with_unknown_architecture_or_missing_tensor_is_rejected() -> None:
    fields = model_fields(create_model("mlp", 1, 10, 8))
    spec = PayloadSpec(models=(ModelSpec(),))
    renamed = Payload(fields.arrays, {"model.arch": "no_such_net"})
    with pytest.raises(PayloadError, match="no_such_net"):
        validate_payload(renamed, spec, DIMS, 0)
    missing = Payload({k: v for k, v in list(fields.arrays.items())[1:]}, fields.scalars)
    with pytest.raises(PayloadError, match="nothing"):
        validate_payload(missing, spec, DIMS, 0)


def test_model_with_nan_weights_is_rejected() -> None:
    fields = model_fields(create_model("mlp", 1, 10, 8))
    arrays = dict(fields.arrays)
    key = next(iter(arrays))
    arrays[key] = np.full_like(arrays[key], np.nan)
    with pytest.raises(PayloadError, match="finite"):
        validate_payload(
            Payload(arrays, fields.scalars), PayloadSpec(models=(ModelSpec(),)), DIMS, 0
        )


def test_payload_refuses_non_array_values() -> None:
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        Payload({"x": [1, 2, 3]})  # type: ignore[dict-item]
