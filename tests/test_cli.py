"""The command line, end to end on tiny digits runs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from oneshotfl.cli.main import app
from oneshotfl.data.partition import PARTITIONERS
from oneshotfl.methods import METHODS

runner = CliRunner()
TINY = [
    "--dataset",
    "digits",
    "--clients",
    "3",
    "--model",
    "mlp",
    "--local-epochs",
    "1",
    "--local-steps",
    "0",
    "--device",
    "cpu",
]


def test_list_prints_every_registered_name() -> None:
    result = runner.invoke(app, ["list", "methods"])
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.splitlines() if line.strip()]
    assert names == METHODS.names()
    result = runner.invoke(app, ["list", "partitioners"])
    assert [ln.split()[0] for ln in result.output.splitlines()] == PARTITIONERS.names()
    bad = runner.invoke(app, ["list", "gadgets"])
    assert bad.exit_code == 2 and "expected one of" in bad.output


def test_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "run",
            *TINY,
            "--method",
            "local,fedavg,ensemble:weighting=size",
            "--out",
            str(out),
            f"cache_dir={tmp_path / 'cache'}",
            "partition=iid",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    assert [m["key"] for m in doc["methods"]] == ["local", "fedavg", "ensemble:weighting=size"]
    assert doc["config"]["partition"] == "iid"
    for name in ("methods.csv", "clients.csv", "partition.png"):
        assert (out / name).stat().st_size > 0
    assert "ensemble:weighting=size" in result.output
    again = runner.invoke(app, ["run", *TINY, "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.output


def test_run_from_yaml_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "dataset: digits\nclients: 2\nmodel: mlp\nlocal_epochs: 1\nlocal_steps: 0\n"
        "methods: [ensemble]\ndevice: cpu\npartition: iid\n"
        f"cache_dir: {tmp_path / 'cache'}\n"
    )
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--config", str(config), "--out", str(out), "clients=3"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["config"]["clients"] == 3 and len(doc["clients"]) == 3


def test_bad_input_gives_one_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", *TINY, "--method", "fedavgg", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown method 'fedavgg'" in result.output and "fedavg" in result.output
    result = runner.invoke(
        app,
        ["run", *TINY, "--partition", "dirichlet", "--alpha", "-1", "--out", str(tmp_path / "x")],
    )
    assert result.exit_code == 2 and "alpha" in result.output


def test_partition_prints_matrix_and_saves_heatmap(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    result = runner.invoke(
        app,
        [
            "partition",
            "--dataset",
            "digits",
            "--partition",
            "pathological",
            "--classes-per-client",
            "2",
            "--clients",
            "5",
            "--png",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "total" in result.output


def test_sweep_then_report(tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: tiny\nbase: {dataset: digits, clients: 2, model: mlp, local_epochs: 1,"
        " local_steps: 0,"
        f" methods: [local, ensemble], device: cpu, cache_dir: '{tmp_path / 'cache'}'}}\n"
        "grid:\n  - {partition: dirichlet, alpha: [0.5, 5.0]}\nseeds: [0, 1]\n"
    )
    out = tmp_path / "results"
    result = runner.invoke(app, ["sweep", str(sweep), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(list(out.rglob("result.json"))) == 4
    resumed = runner.invoke(app, ["sweep", str(sweep), "--out", str(out)])
    assert "0 run(s)" in resumed.output
    doc = tmp_path / "bench.md"
    doc.write_text("# B\n<!-- report:tiny -->\nold\n<!-- /report:tiny -->\nafter\n")
    rep = runner.invoke(
        app,
        [
            "report",
            str(out),
            "--out",
            str(tmp_path / "rep"),
            "--markdown",
            str(doc),
            "--section",
            "tiny",
        ],
    )
    assert rep.exit_code == 0, rep.output
    text = doc.read_text()
    assert "old" not in text and "after" in text and "| local |" in text and "(n=2)" in text
    assert (tmp_path / "rep" / "accuracy_vs_alpha.png").exists()
    assert (tmp_path / "rep" / "summary.csv").exists()


def test_describe_prints_paper_and_hyper_parameters() -> None:
    result = runner.invoke(app, ["describe", "fedol"])
    assert result.exit_code == 0, result.output
    assert "Ye et al." in result.output and "tau = 0.2" in result.output
    assert "\n  public pool: an unlabelled one (public_size > 0)\n" in result.output
    assert runner.invoke(app, ["describe", "nope"]).exit_code == 2


def test_version() -> None:
    from oneshotfl import __version__

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"oneshotfl {__version__}"


def test_option_help_keeps_continuation_lines_that_hold_a_colon() -> None:
    from oneshotfl.cli.options import field_docs
    from oneshotfl.runner.config import ExperimentConfig

    docs = field_docs(ExperimentConfig)
    assert docs["malicious"].endswith("0: nobody attacks, whatever attack says).")
    assert "0" not in docs  # a continuation line is never an option of its own
    assert all(name in docs["attack"] for name in ("over_report", "garbage", "wrong_arch"))


def test_version_answers_without_importing_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['oneshotfl', '--version']\n"
        "from oneshotfl._entry import main; main(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    from oneshotfl import __version__

    assert out.stdout.splitlines() == [f"oneshotfl {__version__}", "False"]


def test_the_flower_commands_answer_without_importing_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['oneshotfl', 'flower', '--help']\n"
        "from oneshotfl._entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch imported:', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "app-dir" in out.stdout and "certs" in out.stdout
    assert out.stdout.splitlines()[-1] == "torch imported: False"


def test_one_run_command_runs_several_seeds(tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    result = runner.invoke(
        app, ["run", *TINY, "--method", "fedavg", "--seed", "0,1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    docs = [json.loads((out / f"seed={s}" / "result.json").read_text()) for s in (0, 1)]
    assert [d["config"]["seed"] for d in docs] == [0, 1]
    assert "2 run(s), one per seed" in result.output
    assert "mean ± 95% interval (Student t) over 2 seeds" in result.output  # not two tables
    mean = 100 * (docs[0]["methods"][0]["accuracy"] + docs[1]["methods"][0]["accuracy"]) / 2
    assert f"{mean:.2f} ±" in result.output
    bad = runner.invoke(app, ["run", *TINY, "--seed", "0,0", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "distinct integers" in bad.output


def test_verbose_shows_our_debug_lines_and_not_the_libraries() -> None:
    import logging

    from oneshotfl.cli.support import setup_logging

    setup_logging(True)
    try:
        assert logging.getLogger("oneshotfl.runner").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.DEBUG)
    finally:
        setup_logging(False)
    assert not logging.getLogger("oneshotfl.runner").isEnabledFor(logging.DEBUG)


def test_cuda_without_a_device_is_one_line_and_a_config_error(tmp_path: Path) -> None:
    import pytest
    import torch

    import oneshotfl

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    args = ["run", "--method", "fedavg", "--dataset", "digits", "--clients", "2"]
    out = CliRunner().invoke(app, [*args, "--device", "cuda", "--out", str(tmp_path / "r")])
    assert out.exit_code == 2, out.output
    assert "no CUDA device" in out.output and "Traceback" not in out.output
    with pytest.raises(oneshotfl.ConfigError, match="no CUDA device"):
        oneshotfl.run(dataset="digits", clients=2, methods=["fedavg"], device="cuda")


def test_run_writes_its_report_as_the_report_command_does(tmp_path: Path) -> None:
    out = tmp_path / "one"
    ran = runner.invoke(
        app, ["run", *TINY, "--method", "fedavg", "--out", str(out), "--report", str(out / "r")]
    )
    assert ran.exit_code == 0, ran.output
    assert f"report: {out / 'r'}" in ran.output
    apart = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "apart")])
    assert apart.exit_code == 0, apart.output
    for name in ("table.md", "summary.csv"):  # the same files, the same text
        assert (out / "r" / name).read_text() == (tmp_path / "apart" / name).read_text()
    assert (out / "r" / "accuracy_vs_bytes.png").is_file()
