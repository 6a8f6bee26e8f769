"""A failing method never costs the run: it is recorded with its one-line reason, the others'
results are written, report and compare show it, and the command's exit status says so."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from helpers import registered, run_config
from oneshotfl.cli.main import app
from oneshotfl.methods.common import SendsTrainedModel
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, NoConfig, ServerContext
from oneshotfl.protocol.outcome import Outcome
from oneshotfl.runner.compare import result_differences
from oneshotfl.runner.report import collect, markdown_table
from oneshotfl.runner.results import write_result
from oneshotfl.typed import Result


class ServerBreaks(SendsTrainedModel[NoConfig]):
    """Its server step raises: a method bug or a data/method mismatch."""

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        raise RuntimeError("cannot aggregate these\nsecond line of detail")


class EveryClientBreaks(SendsTrainedModel[NoConfig]):
    """Every client fails: the quorum is not reached."""

    def client_update(self, ctx: ClientContext) -> Payload:
        raise ValueError(f"client {ctx.client_id} cannot train on this")

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        raise AssertionError("never reached")


def test_a_failing_method_is_recorded_and_the_others_are_written(
    tiny_config: Any, tmp_path: Path
) -> None:
    with registered("server_breaks", ServerBreaks), registered("no_quorum", EveryClientBreaks):
        doc = run_config(tiny_config(methods=["server_breaks", "fedavg", "no_quorum", "local"]))
    assert [m["key"] for m in doc["methods"]] == ["fedavg", "local"]
    failed = doc["failed_methods"]
    assert failed["server_breaks"] == "RuntimeError: cannot aggregate these"  # one line
    assert failed["no_quorum"].startswith("QuorumError: no_quorum: 0 valid answer(s)")
    assert "cannot train on this" in failed["no_quorum"]
    path = write_result(tmp_path, doc)
    back = Result.load(path)
    assert back.failed_methods == failed and back.keys == ("fedavg", "local")
    assert json.loads(path.read_text())["failed_methods"] == failed
    table = markdown_table(collect([doc]))
    assert "| server_breaks | failed (n=1) |" in table
    assert "- server_breaks failed: RuntimeError: cannot aggregate these" in table
    healthy = {**doc, "failed_methods": {}}
    assert result_differences(healthy, doc) == [f"failed methods: {{}} before, {failed} after"]


def test_the_command_writes_the_results_and_exits_1_naming_the_failure(tmp_path: Path) -> None:
    tiny = ["--dataset", "digits", "--clients", "3", "--model", "mlp", "--local-epochs", "1",
            "--local-steps", "0", "--device", "cpu", "--workers", "1"]  # fmt: skip
    out = tmp_path / "run"
    with registered("server_breaks", ServerBreaks):
        result = CliRunner().invoke(
            app, ["run", *tiny, "--method", "fedavg,server_breaks", "--out", str(out)]
        )
    assert result.exit_code == 1, result.output
    assert "failed: server_breaks: RuntimeError: cannot aggregate these" in " ".join(
        result.output.split()
    )
    assert "Traceback" not in result.output
    doc = json.loads((out / "result.json").read_text())
    assert [m["key"] for m in doc["methods"]] == ["fedavg"]
    assert "server_breaks" in doc["failed_methods"]
