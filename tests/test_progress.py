"""Progress from the Python API: shown as the command line shows it, and switchable off."""

from __future__ import annotations

from typing import Any

import pytest

import oneshotfl
from oneshotfl.training.progress import NullTracker, RichTracker, shown_progress


def test_the_api_shows_progress_unless_told_not_to(capsys: pytest.CaptureFixture[str]) -> None:
    mine = NullTracker()
    with shown_progress(mine, True) as t:
        assert t is mine  # the caller's tracker wins
    with shown_progress(None, False) as t:
        assert t is None
    with shown_progress(None, True) as t:
        assert isinstance(t, RichTracker)
        with t.task("training", 2) as advance:
            advance(2)
    with shown_progress(None) as t:  # stderr is not a terminal under pytest: nothing shown
        assert t is None


def test_run_takes_the_progress_switch(tiny_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    import oneshotfl.api as api

    real = api.run_and_write

    def spy(plan: Any, out_dir: Any, tracker: Any, *rest: Any) -> Any:
        seen.append(tracker)
        return real(plan, out_dir, tracker, *rest)

    monkeypatch.setattr(api, "run_and_write", spy)
    cfg = tiny_config(methods=["local"])
    oneshotfl.run(cfg, progress=True)
    oneshotfl.run(cfg, progress=False)
    assert isinstance(seen[0], RichTracker) and seen[1] is None
