"""Hostile and careless input (issue 15's classes): every one is refused as one client's bad
payload, named, and the run goes on with the others; self-reported counts are bounded; bytes
over what the spec can take are refused before anything is decoded; results are written
crash-safely; the command line checks its paths before any training."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import save as st_save
from typer.testing import CliRunner

from helpers import check, prepare, run_config, run_over
from oneshotfl.cli.main import app
from oneshotfl.functional import client_weights
from oneshotfl.methods import build_method
from oneshotfl.models import create_model
from oneshotfl.payload import Payload, WireError, encode
from oneshotfl.protocol import wire
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.spec import PayloadError, WireDims
from oneshotfl.runner import results
from oneshotfl.runner.config import ConfigError
from oneshotfl.runner.errors import RequirementError
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.transport import ClientReply, LocalTransport, Missing

SCALARS = "oneshotfl.scalars"


def raw_payload(arrays: dict[str, np.ndarray], scalars_json: str) -> bytes:
    """Safetensors bytes whose scalar metadata is ``scalars_json`` verbatim."""
    return bytes(st_save(arrays, metadata={SCALARS: scalars_json}))


def model_arrays(arch: str) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    return dict(model_fields(create_model(arch, 1, 10, 8)).arrays)


def with_scalars(arch: str, text: str) -> bytes:
    return raw_payload(model_arrays(arch), text)


# Each class of hostile payload a client of a model-sharing method (mlp clients) may send.
HOSTILE: dict[str, Callable[[], bytes]] = {
    "scalar is a list": lambda: with_scalars("mlp", '{"model.arch": "mlp", "n_examples": [1]}'),
    "scalar is null": lambda: with_scalars("mlp", '{"model.arch": "mlp", "n_examples": null}'),
    "scalar is an object": lambda: with_scalars("mlp", '{"model.arch": {"a": 1}, "n_examples": 5}'),
    "scalars nested past the parser": lambda: with_scalars(  # 40 KB: within the byte limit
        "mlp", '{"model.arch": "mlp", "n_examples": ' + "[" * 20_000 + "]" * 20_000 + "}"
    ),
    "weights that overflow": lambda: raw_payload(
        {k: np.full_like(v, 3e38) for k, v in model_arrays("mlp").items()},
        json.dumps({"model.arch": "mlp", "n_examples": 5}),
    ),
    "n_examples = 10**18": lambda: with_scalars(
        "mlp", json.dumps({"model.arch": "mlp", "n_examples": 10**18})
    ),
    "n_examples = 10**400": lambda: with_scalars(
        "mlp", json.dumps({"model.arch": "mlp", "n_examples": 10**400})
    ),
    "another architecture than configured": lambda: with_scalars(
        "cnn", json.dumps({"model.arch": "cnn", "n_examples": 5})
    ),
    "oversize upload": lambda: raw_payload(
        {**model_arrays("mlp"), "pad": np.zeros(4_000_000, np.float32)},
        json.dumps({"model.arch": "mlp", "n_examples": 5}),
    ),
    "garbage bytes": lambda: b"\x00" * 64,
}


class HostileClientOne(LocalTransport):
    """The in-process transport, with client 1's bytes replaced by ``data``."""

    def __init__(self, experiment: Federation, data: bytes) -> None:
        super().__init__(experiment)
        object.__setattr__(self, "data", data)

    def upload(
        self, key: str, method: Any, round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        replies, missing = super().upload(key, method, round_index, broadcast)
        bad = self.data
        return [
            dataclasses.replace(r, data=bad) if r.client_id == 1 else r for r in replies
        ], missing


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    from helpers import TINY
    from oneshotfl.runner.config import make_config

    cache = tmp_path_factory.mktemp("cache")
    return prepare(make_config({**TINY, "cache_dir": str(cache), "min_clients": 2}))


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("method", ["fedavg", "ensemble:weighting=size"])
def test_a_hostile_client_is_refused_named_and_the_run_goes_on(
    federation: Federation, method: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    transport = HostileClientOne(federation, HOSTILE[kind]())
    result = run_over(method, build_method(method), federation, transport).to_dict()
    assert result["clients_used"] == [0, 2]
    assert result["rejected"]["1"].startswith("client 1: ")
    assert 0.0 <= result["accuracy"] <= 1.0
    assert "rejected the payload of client 1" in caplog.text


def test_oversize_bytes_are_refused_before_anything_is_decoded(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(wire, "decode", lambda data: calls.append(len(data)))
    spec = build_method("fedavg").payload_spec(federation.dims)
    limit = wire.byte_limit(spec, federation.dims, 1)
    assert limit is not None and limit < 1_000_000  # an mlp on 8x8 digits: ~290 KB
    with pytest.raises(WireError, match="client 1: expected at most"):
        wire.receive(HOSTILE["oversize upload"](), spec, federation.dims, 1)
    assert calls == []


def test_a_model_that_cannot_be_built_for_the_task_is_refused(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oneshotfl.protocol import validate as spec_module

    def refuse(arch: str, *args: Any) -> Any:
        raise ValueError(f"{arch} needs images of at least 32 pixels")

    monkeypatch.setattr(spec_module, "create_model", refuse)
    monkeypatch.setattr(spec_module, "_REFERENCE_CACHE", {})
    spec = build_method("fedavg").payload_spec(federation.dims)
    data = with_scalars("mlp", json.dumps({"model.arch": "mlp", "n_examples": 5}))
    with pytest.raises(PayloadError, match="can be built for this task"):
        wire.receive(data, spec, federation.dims, None)


def test_a_negative_batchnorm_variance_is_refused() -> None:
    dims = WireDims(10, 1, 8, 0, {}, ("simple_cnn2",), max_examples=100)
    spec = build_method("fedavg").payload_spec(dims)
    torch.manual_seed(0)
    fields = model_fields(create_model("simple_cnn2", 1, 10, 8))
    arrays = {
        k: -np.ones_like(v) if k.endswith("running_var") else v for k, v in fields.arrays.items()
    }
    data = encode(Payload(arrays, {**fields.scalars, "n_examples": 5}))
    with pytest.raises(PayloadError, match="non-negative BatchNorm variances"):
        wire.receive(data, spec, dims, 0)


def test_counts_are_bounded_by_what_the_payload_proves() -> None:
    dims = WireDims(10, 1, 8, 0, {"D": 4}, (), max_examples=100)
    fedage = build_method("fedage").payload_spec(dims)
    head = model_fields(create_model("head_mlp", 4, 10, 1), "head")
    latents = {"latents": np.zeros((5, 4), np.float32)}
    for n, ok in ((5, True), (7, False)):
        payload = Payload({**head.arrays, **latents}, {**head.scalars, "n_examples": n})
        if ok:
            wire.receive(encode(payload), fedage, dims, 0)
        else:
            with pytest.raises(PayloadError, match="the rows sent"):
                wire.receive(encode(payload), fedage, dims, 0)
    cvae = build_method("fedcvae").payload_spec(dims)
    decoder = {a.name: np.zeros([int(d) for d in a.shape], np.float32) for a in cvae.arrays[:-1]}
    for counts, match in ((10**15, "values in"), (0, "summing to at least 1")):
        payload = Payload({**decoder, "label_counts": np.full(10, counts, np.int64)})
        with pytest.raises(PayloadError, match=match):
            wire.receive(encode(payload), cvae, dims, 2)
    most = Payload({**decoder, "label_counts": np.full(10, 99, np.int64)})  # 990 > N_max
    with pytest.raises(PayloadError, match="summing to at most 100"):
        wire.receive(encode(most), cvae, dims, 2)


def test_clipped_weighting_caps_an_over_reporting_client() -> None:
    sizes = [100.0, 120.0, 80.0, 10_000.0]
    assert client_weights(sizes, "size").tolist() == sizes
    assert client_weights(sizes, "uniform").tolist() == [1.0] * 4
    # torch's median of four is the lower middle value, 100: nobody weighs more than 200
    assert client_weights(sizes, "clipped").tolist() == [100.0, 120.0, 80.0, 200.0]


def test_a_crash_while_writing_leaves_no_result_marker(
    federation: Federation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    doc = run_config(dataclasses.replace(federation.cfg, methods=("fedavg",)))
    real = results.write_csv

    def crash_on_local(path: Path, *args: Any) -> None:
        if path.name == "local.csv":
            raise OSError("killed")
        real(path, *args)

    monkeypatch.setattr(results, "write_csv", crash_on_local)
    with pytest.raises(OSError, match="killed"):
        results.write_result(tmp_path / "run", doc)
    assert not (tmp_path / "run" / "result.json").exists()  # the sweep will run it again
    monkeypatch.setattr(results, "write_csv", real)
    results.write_result(tmp_path / "run", doc)
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"result.json", "methods.csv", "clients.csv", "local.csv"} <= names


def test_the_command_line_checks_its_paths_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import oneshotfl.api as api

    def no_training(plan: Any, *args: Any, **kwargs: Any) -> Any:
        prepare(plan.cfg)  # loads the data: a missing data root fails here
        raise AssertionError("would train before checking the paths")

    monkeypatch.setattr(api, "run_experiment", no_training)  # what the command runs
    a_file = tmp_path / "taken"
    a_file.write_text("")
    runner = CliRunner()
    out = ["--out", str(tmp_path / "run")]
    base = ["run", "--method", "fedavg", "--dataset", "fashion_mnist", "--clients", "2"]
    for extra, fragment in (
        (["--data-root", str(tmp_path / "missing"), *out], "expected an existing directory"),
        (["--out", str(a_file)], "expected a directory, got a file"),
    ):
        out = runner.invoke(app, [*base, *extra])
        assert out.exit_code == 2, out.output
        assert fragment in " ".join(out.output.split())
        assert "Traceback" not in out.output


def test_a_broken_encoder_file_is_a_clear_encoder_error(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from oneshotfl.data.types import TaskInfo
    from oneshotfl.encoders import build_encoder
    from oneshotfl.encoders.base import EncoderError
    from oneshotfl.encoders.pretrain import content_hash

    task = TaskInfo("digits", 10, 1, 8)
    state = {"w": torch.zeros(3, 3)}
    meta = {"arch": json.dumps("conv"), "content_hash": json.dumps(content_hash(state))}
    no_dims = tmp_path / "no-dims.safetensors"
    save_file(state, str(no_dims), metadata={**meta, "in_channels": "1"})
    wrong = tmp_path / "wrong.safetensors"
    extra = {"in_channels": "1", "dim": "8", "width": "4"}
    save_file(state, str(wrong), metadata={**meta, **extra})
    for path, fragment in ((no_dims, "lacks integer 'dim'"), (wrong, "does not hold a conv")):
        with pytest.raises(EncoderError, match=fragment):
            build_encoder(f"file:path={path}", task, 0)


@pytest.mark.parametrize("attack", ["garbage", "oversize:mib=1", "wrong_arch:arch=cnn"])
def test_a_configured_bad_client_is_refused_named_and_the_run_goes_on(
    tiny_config: Any, attack: str
) -> None:

    doc = run_config(tiny_config(methods=["fedavg"], malicious=1, attack=attack))
    result = doc["methods"][0]
    assert result["clients_used"] == [1, 2]
    assert result["rejected"]["0"].startswith("client 0: ")


def test_several_attacks_are_dealt_out_to_the_malicious_clients_in_turn(
    tiny_config: Any,
) -> None:
    """``a+b+c``: malicious client i follows attack i mod 3; each is refused and named with
    its own reason, the honest client is aggregated, and each client's row says its attack."""

    mix = "garbage+oversize:mib=1+wrong_arch:arch=cnn"
    cfg = tiny_config(methods=["fedavg"], clients=4, malicious=3, attack=mix, min_clients=1)
    doc = run_config(cfg)
    result = doc["methods"][0]
    assert result["clients_used"] == [3]
    assert "expected shape" in result["rejected"]["0"]
    assert "expected at most" in result["rejected"]["1"]
    assert "expected 'mlp'" in result["rejected"]["2"]
    rows = {row["client"]: row.get("malicious") for row in doc["clients"]}
    assert rows == {0: "garbage", 1: "oversize:mib=1", 2: "wrong_arch:arch=cnn", 3: None}
    exp = prepare(tiny_config(clients=4, malicious=3, attack="label_flip+garbage"))
    assert [a.spec if a else None for a in map(exp.attack_of, range(4))] == [
        "label_flip",
        "garbage",
        "label_flip",
        None,
    ]


@pytest.mark.parametrize(
    ("attack", "fragment"),
    [("garbage+", "got an empty one"), ("garbage+nope", "nope")],
)
def test_a_bad_mix_of_attacks_is_a_config_error(
    tiny_config: Any, attack: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        tiny_config(malicious=2, attack=attack)


def test_an_attack_of_the_mix_that_cannot_act_is_named_before_training(tiny_config: Any) -> None:
    """``wrong_predictions`` cannot act on FedAvg's model payload: the check names that
    attack of the mix, not the whole setting."""
    exp = prepare(tiny_config(malicious=2, attack="garbage+wrong_predictions"))
    with pytest.raises(RequirementError, match="attack 'wrong_predictions'"):
        check(exp, [("fedavg", build_method("fedavg"))])
