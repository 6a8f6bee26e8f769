"""Files written whole or not at all: the bytes go to a temporary file beside the target,
which is then renamed over it, so a crash never leaves half a file and a reader sees the old
file or the new one.

The temporary file is created with mode ``0o666`` filtered by the process's umask, as
``open()`` would create the target itself (``tempfile.mkstemp`` makes it ``0o600``, which the
rename would keep: result files unreadable to collaborators on a shared machine).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (its folder created) through a temporary file and a rename;
    the file's mode follows the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))
