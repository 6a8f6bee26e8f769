"""Facts about where a run ran, for its result file and its tracked run: the CPU, the code's
git commit and a hash of the data — so two results can be told apart, or matched, later."""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path

from oneshotfl.data.federated import FederatedData
from oneshotfl.fingerprints import tensor_fingerprint


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit() -> str | None:
    """The commit of the oneshotfl source tree when it is a git checkout (``+dirty`` with
    uncommitted changes), else None (an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", str(here)],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def data_hash(data: FederatedData) -> str:
    """A hash of everything the run's data holds: every client's training and validation
    examples, the public pool and the test split (the same files, seeds and partition give
    the same hash; a node that holds one shard hashes that shard)."""
    digest = hashlib.sha256()
    for shard in data.clients:
        digest.update(tensor_fingerprint(shard.train.x, shard.train.y).encode())
        if shard.val is not None:
            digest.update(tensor_fingerprint(shard.val.x, shard.val.y).encode())
    if data.public is not None:
        digest.update(tensor_fingerprint(data.public.x).encode())
    digest.update(tensor_fingerprint(data.test.x, data.test.y).encode())
    return digest.hexdigest()[:16]
