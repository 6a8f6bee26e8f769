"""``benchmarks/authors/load.py``, the loader every authors' plugin runs their code through,
tested on files the test writes (no checkout needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loader() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks" / "authors"))
    try:
        import load
    finally:
        sys.path.pop(0)
    return load


def test_lines_nested_in_a_main_block_run_unedited_and_a_cut_statement_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "script.py").write_text(
        "import sys\n"  # 1
        "if __name__ == '__main__':\n"  # 2
        "    for k in range(3):\n"  # 3
        "        total = sum(parts)\n"  # 4
        "        scaled = [\n"  # 5
        "            total * g for g in gains]\n"  # 6
        "        print(scaled)\n"  # 7
    )
    monkeypatch.setenv("SCRIPT_REPO", str(tmp_path))
    load = loader()
    out = load.authors_lines("SCRIPT_REPO", "script.py", 4, 6, {"parts": [1, 2], "gains": [2]})
    assert out["total"] == 3 and out["scaled"] == [6] and "k" not in out
    with pytest.raises(ValueError, match="lines 4–5 cut the statement of lines 5–6"):
        load.authors_lines("SCRIPT_REPO", "script.py", 4, 5, {})


def test_a_range_that_cuts_a_compound_statement_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running part of an ``if`` would run its branches without their condition."""
    (tmp_path / "branches.py").write_text(
        "x = 1\n"  # 1
        "if flag:\n"  # 2
        "    w = 'a'\n"  # 3
        "else:\n"  # 4
        "    w = 'b'\n"  # 5
        "try:\n"  # 6
        "    v = 1\n"  # 7
        "except KeyError:\n"  # 8
        "    v = 2\n"  # 9
    )
    monkeypatch.setenv("SCRIPT_REPO", str(tmp_path))
    load = loader()
    for first, last in ((3, 5), (1, 3)):
        with pytest.raises(ValueError, match="cut the statement of lines 2–5"):
            load.authors_lines("SCRIPT_REPO", "branches.py", first, last, {"flag": True})
    assert load.authors_lines("SCRIPT_REPO", "branches.py", 5, 5, {})["w"] == "b"
    assert load.authors_lines("SCRIPT_REPO", "branches.py", 9, 9, {})["v"] == 2
    assert load.authors_lines("SCRIPT_REPO", "branches.py", 1, 5, {"flag": False})["w"] == "b"
