"""Own methods without editing the package: a module or .py file named in ``plugins``
(``--plugin``), an installed package's entry point, or an import from Python — on the command
line, in worker processes and on Flower nodes; a broken plugin is a one-line error."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from helpers import run_config
from oneshotfl import plugins
from oneshotfl.cli.main import app
from oneshotfl.methods import METHODS
from oneshotfl.models import MODELS
from oneshotfl.runner.compare import result_differences
from oneshotfl.runner.config import ConfigError

runner = CliRunner()

PLUGIN = '''
"""A user's method, kept outside the package: FedAvg of the clients' models, halved heads."""
from oneshotfl.methods.base import register_method
from oneshotfl.methods.fedavg import FedAvg


@register_method("{name}", "my own FedAvg variant")
class Mine(FedAvg):
    """FedAvg under another name."""
'''


def test_a_plugin_file_adds_a_method_to_the_command_line(tmp_path: Path, forget: list[str]) -> None:
    forget.append("mine_cli")
    file = tmp_path / "mine.py"
    file.write_text(PLUGIN.format(name="mine_cli"))
    args = ["--dataset", "digits", "--clients", "2", "--model", "mlp", "--local-epochs", "1",
            "--local-steps", "0", "--workers", "1", "--device", "cpu", "--no-cache"]  # fmt: skip
    out = tmp_path / "run"
    refused = runner.invoke(app, ["run", *args, "--method", "mine_cli", "--out", str(out)])
    assert refused.exit_code == 2 and "unknown method 'mine_cli'" in refused.output
    result = runner.invoke(
        app, ["run", *args, "--method", "mine_cli,fedavg", "--plugin", str(file), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["config"]["plugins"] == [str(file)]
    rows = {m["key"]: m["accuracy"] for m in doc["methods"]}
    assert rows["mine_cli"] == rows["fedavg"]
    listed = runner.invoke(app, ["list", "methods", "--plugin", str(file)])
    assert "mine_cli" in listed.output and "my own FedAvg variant" in listed.output


ENCODER_PLUGIN = textwrap.dedent('''

    import torch
    from oneshotfl.encoders.base import ENCODERS, Encoder, Preprocess


    class Pooled(torch.nn.Module):
        """An encoder module of the plugin's own class: 2×2 average pooling, flattened."""

        def forward(self, x):
            return torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1)


    @ENCODERS.register("mine_encoder", "2x2 pooled pixels")
    def mine_encoder(options, ctx):
        return Encoder(ctx.spec, Pooled(), 4 * ctx.task.in_channels, Preprocess(), ctx.task)
    ''')


def test_a_plugin_module_reaches_the_worker_processes(
    tiny_config: Any, tmp_path: Path, forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    forget.append("mine_pool")
    (tmp_path / "my_plugin_pool.py").write_text(PLUGIN.format(name="mine_pool"))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tiny_config(clients=3, methods=["mine_pool", "fedavg"], plugins=["my_plugin_pool"])
    doc = run_config(dataclasses.replace(cfg, workers=2))
    rows = {m["key"]: m for m in doc["methods"]}
    assert "no_reply" not in rows["mine_pool"]
    assert rows["mine_pool"]["accuracy"] == rows["fedavg"]["accuracy"]


@pytest.mark.xdist_group("forkserver")  # one forkserver with test_pool.py's forkserver test
def test_a_plugin_file_reaches_forkserver_workers_and_the_result_is_the_same(
    tiny_config: Any, tmp_path: Path, forget: list[str]
) -> None:
    """Two threads per client step: workers come from a forkserver, which has imported
    nothing of the parent's — the plugin and the experiment reach them as the config says.
    The experiment itself holds a plugin object (the encoder's own module class), so it can
    be unpickled only after the plugin is imported."""
    forget += ["mine_server", "mine_encoder"]
    file = tmp_path / "my_plugin_server.py"
    file.write_text(PLUGIN.format(name="mine_server") + ENCODER_PLUGIN)
    cfg = tiny_config(
        clients=3, methods=["mine_server", "head_avg"], plugins=[str(file)], client_threads=2,
        encoder="mine_encoder",
    )  # fmt: skip
    one, two = (run_config(dataclasses.replace(cfg, workers=w)) for w in (1, 2))
    assert [m.get("no_reply") for m in two["methods"]] == [None, None]
    assert result_differences(one, two) == []


def test_an_installed_entry_point_registers_under_its_name(
    tiny_config: Any, tmp_path: Path, forget: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    forget += ["mine_entry", "tiny_mlp"]
    (tmp_path / "my_plugin_pkg.py").write_text(
        textwrap.dedent('''
        from oneshotfl.methods.fedavg import FedAvg
        from oneshotfl.models.mlp import MLP

        class Unregistered(FedAvg):
            """A method its module does not register: the entry point's name does."""

        def tiny_mlp(in_channels, num_classes, image_size):
            return MLP(in_channels, num_classes, image_size, hidden=(16,))
        ''')
    )
    info = tmp_path / "my_plugin_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[oneshotfl.methods]\nmine_entry = my_plugin_pkg:Unregistered\n\n"
        "[oneshotfl.models]\ntiny_mlp = my_plugin_pkg:tiny_mlp\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._scanned.clear()
    doc = run_config(tiny_config(methods=["mine_entry"], model="tiny_mlp"))
    assert "mine_entry" in METHODS and "tiny_mlp" in MODELS
    assert doc["clients"][0]["arch"] == "tiny_mlp" and 0.0 <= doc["methods"][0]["accuracy"] <= 1


def test_a_plugin_that_cannot_be_loaded_is_one_line(tiny_config: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plugin 'no_such_plugin_module': expected an"):
        tiny_config(plugins=["no_such_plugin_module"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half written')\n")
    with pytest.raises(ConfigError, match="RuntimeError: half written"):
        tiny_config(plugins=[str(broken)])
    with pytest.raises(ConfigError, match="expected a Python file, found none"):
        tiny_config(plugins=[str(tmp_path / "missing.py")])
    result = runner.invoke(app, ["describe", "fedavg", "--plugin", "no_such_plugin_module"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_plugin_files_with_one_stem_do_not_replace_each_other(
    tiny_config: Any, tmp_path: Path, forget: list[str]
) -> None:
    forget += ["stem_a", "stem_b"]
    for folder, name in (("a", "stem_a"), ("b", "stem_b")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plugin.py").write_text(PLUGIN.format(name=name))
    files = [str(tmp_path / f / "plugin.py") for f in ("a", "b")]
    tiny_config(plugins=files)
    assert "stem_a" in METHODS and "stem_b" in METHODS
    names = {plugins.plugin_module_name(Path(f)) for f in files}
    assert len(names) == 2 and names <= set(sys.modules)
    broken = tmp_path / "half.py"
    broken.write_text("import sys\nraise RuntimeError('half written')\n")
    with pytest.raises(ConfigError):
        tiny_config(plugins=[str(broken)])
    assert plugins.plugin_module_name(broken) not in sys.modules  # not left half imported


def test_an_entry_point_that_takes_a_registered_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "clash_pkg.py").write_text("class Other:\n    pass\n")
    info = tmp_path / "clash_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[oneshotfl.methods]\nfedavg = clash_pkg:Other\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._scanned.clear()
    try:
        with pytest.raises(plugins.PluginError, match=r"'fedavg'.*expected a new name"):
            plugins.load_entry_points()
    finally:
        monkeypatch.undo()
        plugins._scanned.clear()


def test_the_plugin_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """The plugins page's "Your own method, end to end": a plugin file, run, saved, tracked."""
    import re
    import subprocess

    page = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    section = page[page.index("## Your own method, end to end") :]
    script = re.search(r"```bash\n(.*?)```", section, re.S)
    assert script is not None
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "-ec", script.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GlobalModel(model=LeNet5(" in done.stdout
    assert (tmp_path / "runs" / "mine" / "models" / "largest_client.safetensors").is_file()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'my-mlflow.db'}")
    experiment = client.get_experiment_by_name("my-study")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "first" and "largest_client/accuracy" in run.data.metrics


def test_reading_a_result_back_never_runs_its_plugins(tmp_path: Path, forget: list[str]) -> None:
    import oneshotfl

    forget.append("mine_read")
    marker = tmp_path / "imported"
    file = tmp_path / "mine_read.py"
    file.write_text(PLUGIN.format(name="mine_read") + f"\nopen({str(marker)!r}, 'a').write('x')\n")
    settings = {"dataset": "digits", "clients": 2, "model": "mlp", "local_epochs": 1,
                "local_steps": 0, "workers": 1, "cache_dir": None}  # fmt: skip
    oneshotfl.run({**settings, "methods": ["mine_read"], "plugins": [str(file)]}, tmp_path / "r")
    assert marker.read_text() == "x"  # the run imported it once
    file.unlink()  # the plugin is gone, as on another machine
    again = oneshotfl.Result.load(tmp_path / "r")
    assert again.config.plugins == (str(file),) and marker.read_text() == "x"
