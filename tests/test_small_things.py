"""Small things users meet: what the cache summary says, where trackers write by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import run_config
from oneshotfl.cli.support import cache_summary
from oneshotfl.tracking.backends import DEFAULT_DIRS


def test_the_cache_summary_tells_reuse_within_a_run_from_reads_of_earlier_runs(
    tiny_config: Any, tmp_path: Path
) -> None:
    cfg = tiny_config(methods=["local", "fedavg", "ensemble"], cache_dir=str(tmp_path / "c"))
    first, again = run_config(cfg), run_config(cfg)
    assert first["cache"]["hits"] > 0 and first["cache"]["from_disk"] == 0  # reuse in-run
    assert cache_summary(first).endswith(", 0 read from earlier runs")
    assert again["cache"]["misses"] == 0 and again["cache"]["from_disk"] > 0
    assert f"{again['cache']['from_disk']} read from earlier runs" in cache_summary(again)
    old = {**first, "cache": {"hits": 3, "misses": 2}}  # a result written before
    assert cache_summary(old) == "cache: 3 hits, 2 misses"


def test_trackers_write_under_runs_by_default() -> None:
    assert {"tensorboard": Path("runs/tensorboard"), "mlflow": Path("runs/mlflow")} == DEFAULT_DIRS


def test_the_server_side_runs_at_server_threads(tiny_config: Any) -> None:
    """Like client steps at ``client_threads``, the server side (aggregation, server
    training, evaluation) runs at ``server_threads``, whatever the process has."""
    import torch

    from helpers import registered
    from oneshotfl.methods.fedavg import FedAvg
    from oneshotfl.protocol.fold import Fold

    seen: list[int] = []

    class Counting(FedAvg):  # type: ignore[misc]
        def fold(self, ctx: Any) -> Any:  # each payload folded between the clients' steps
            inner = super().fold(ctx)

            class Count(Fold):
                def add(self, client_id: int, payload: Any) -> None:
                    seen.append(torch.get_num_threads())
                    inner.add(client_id, payload)

                def finish(self) -> Any:
                    return inner.finish()

            return Count()

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with registered("counting", Counting):
            run_config(tiny_config(methods=["counting"]))
            run_config(tiny_config(methods=["counting"], server_threads=None))
        assert seen == [1] * 3 + [2] * 3 and torch.get_num_threads() == 2  # restored afterwards
    finally:
        torch.set_num_threads(before)


def test_a_requirement_error_names_the_flag_beside_the_key(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    out = CliRunner().invoke(
        app, ["run", "--dataset", "digits", "--method", "fedol", "--out", str(tmp_path / "r")]
    )
    assert out.exit_code == 2
    assert "set public_size (--public-size) > 0" in " ".join(out.output.split())


def test_no_method_description_names_an_issue_number() -> None:
    import re

    from oneshotfl.cli.describe import describe_method
    from oneshotfl.methods import METHODS

    for name in METHODS.names():
        assert not re.search(r"\bissue \d+", describe_method(name)), name


def test_the_top_level_help_has_no_raw_markup_and_only_summaries() -> None:
    from typer.testing import CliRunner

    from oneshotfl.cli.main import app

    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"}).output
    assert "``" not in text
    commands = text.split("Commands")[1]
    assert "Every point to run" not in commands  # the summary line only
