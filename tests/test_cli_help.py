"""``oneshotfl run --help`` reads on an 80-column terminal: grouped, short, defaults whole."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from oneshotfl.cli.main import RUN_OPTIONS, app
from oneshotfl.cli.options import default_text, short_help
from oneshotfl.runner.config import ExperimentConfig


def _help(*command: str, columns: int = 80) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _flat(text: str) -> str:
    """The help without its boxes, whitespace collapsed: wrapped cells read as one line."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_run_help_fits_an_80_column_terminal_in_under_150_lines() -> None:
    text = _help("run")
    assert len(text.splitlines()) < 150, len(text.splitlines())
    assert not re.search(r"\S…", text), "a cell was cut short with an ellipsis"


def test_run_help_groups_the_settings_in_panels() -> None:
    text = _help("run")
    for panel in ("Tracking and saved models", "Methods", "Data and partition", "Clients"):
        assert f"─ {panel} ─" in text, panel
    for panel in ("Server", "Attacks (robustness studies)", "Execution"):
        assert f"─ {panel} ─" in text, panel
    assert "─ Other settings ─" not in text  # every setting has its panel


@pytest.mark.parametrize("columns", [80, 120])
def test_every_default_is_shown_whole(columns: int) -> None:
    flat = _flat(_help("run", columns=columns))
    options = {p.name for p in RUN_OPTIONS}
    for f in dataclasses.fields(ExperimentConfig):
        if f.name in options:
            shown = f"default: {default_text(f).replace(',', ', ')})"
            assert shown in flat, (f.name, shown)
    assert "default: local, fedavg, ensemble, centralized)" in flat


def test_choices_are_shown_not_eaten_as_markup() -> None:
    assert "(sgd|adam; default: sgd)" in _flat(_help("run"))


def test_short_help_cuts_at_a_clause_end_outside_parentheses() -> None:
    assert short_help("a short text.") == "a short text"
    long = "how many clients (ids 0 … m−1) follow attack (robustness studies; 0: nobody attacks)"
    assert short_help(long) == "how many clients (ids 0 … m−1) follow attack"
    text = "fewest valid payloads a method needs: at the server (star), or clients whose message"
    assert short_help(text) == "fewest valid payloads a method needs"


def test_no_command_help_shows_raw_markup() -> None:
    for command in ((), ("run",), ("sweep",), ("report",), ("describe",)):
        text = _help(*command)
        assert "``" not in text and ":mod:" not in text and ":class:" not in text, command
