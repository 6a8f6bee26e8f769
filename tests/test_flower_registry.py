"""Every registered method over Flower, parametrised from the registry (issue 52): on the
contract's federation (``fingerprints.contract_config``), through the real ServerApp body and
ClientApp handler (:class:`fakegrid.FakeGrid`), each client's round-0 payload is the one
recorded for the local contract (``tests/contract/<name>.json``) and the outcome's accuracy
its recorded one — the same check ``test_contract.py`` makes of the local run, so a method
runs on Flower as it does locally, a new one included, with no list to edit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fakegrid import FakeGrid, run_on_grid, task_identity  # noqa: F401
from fingerprints import contract_config, contract_params, payload_differences, recorded
from oneshotfl.flower.messages import read_instruction, read_reply
from oneshotfl.methods import METHODS, MethodSpec


def round_zero_payloads(grid: FakeGrid) -> dict[int, bytes]:
    """Each client's round-0 update as it crossed the wire (the replies to round-0 update
    instructions; the fake grid answers every message it is sent, in order)."""
    assert len(grid.sent) == len(grid.replies), "a node stayed silent"
    out: dict[int, bytes] = {}
    for sent, reply in zip(grid.sent, grid.replies, strict=True):
        instruction = read_instruction(sent.content)
        if instruction.step == "update" and instruction.round == 0:
            answer = read_reply(reply.content)
            out[answer.client_id] = answer.data
    return out


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_on_flower_matches_its_contract_record(name: str, tmp_path: Path) -> None:
    record = recorded(name)
    spec = MethodSpec(name, contract_params(name))
    cfg = dataclasses.replace(contract_config(name), methods=(spec.key,))
    grid = FakeGrid(cfg.clients)
    doc = run_on_grid(tmp_path, cfg, grid)
    assert not doc.get("failed_methods"), doc.get("failed_methods")
    (result,) = doc["methods"]
    payloads = round_zero_payloads(grid)
    diffs = payload_differences(record, payloads)
    assert not diffs, "\n".join(diffs[:10])
    assert result["accuracy"] == pytest.approx(record["accuracy"], abs=0.02)
