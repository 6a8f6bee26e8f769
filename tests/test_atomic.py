"""Files written whole: their mode follows the umask, and a failed write leaves nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from oneshotfl.atomic import atomic_write_bytes, atomic_write_text
from oneshotfl.runner.files import write_csv


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "result.json", "{}\n")
        write_csv(tmp_path / "t.csv", [{"a": 1, "b": [2, 3]}], ["a", "b"])
    finally:
        os.umask(old)
    for name in ("result.json", "t.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert (tmp_path / "t.csv").read_bytes() == b"a,b\r\n1,2 3\r\n"  # as csv writes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "t.csv"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    atomic_write_text(target, "old")

    def boom(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_bytes(target, b"new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
