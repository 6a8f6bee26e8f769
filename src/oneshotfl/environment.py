"""Facts about where a run ran, for its result file and its tracked run: the CPU, the code's
git commit and a hash of the data — so two results can be told apart, or matched, later.

Two runs of one config give bit-identical numbers only where the same float kernels ran them:
the same CPU (vendor, family, model, stepping: the model *name* alone can be as vague as
``AMD EPYC``), the same instruction set torch dispatched to (``AVX512``, ``AVX2``…; an
``ATEN_CPU_CAPABILITY`` limit changes it on one machine), the same torch build, thread count
and device. :func:`kernel_signature` records those facts and :func:`kernel_differences` says
which of them two results do not share — the test of whether an exact comparison is fair.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from oneshotfl.data.federated import FederatedData
from oneshotfl.fingerprints import tensor_fingerprint


def _cpuinfo(*keys: str) -> dict[str, str]:
    """The first value of each of ``keys`` in ``/proc/cpuinfo`` (Linux; empty elsewhere)."""
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in keys:
                found.setdefault(key.strip(), value.strip())
            if len(found) == len(keys):
                break
    except OSError:
        pass
    return found


def _platform_cpu() -> str:
    return platform.processor() or platform.machine() or "unknown"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    return _cpuinfo("model name").get("model name") or _platform_cpu()


def cpu_id() -> str:
    """The CPU's vendor, family, model and stepping (``AuthenticAMD family 25 model 17
    stepping 1``; ``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    labels = {"vendor_id": "", "cpu family": "family ", "model": "model ", "stepping": "stepping "}
    found = _cpuinfo(*labels)
    return " ".join(labels[k] + found[k] for k in labels if k in found) or _platform_cpu()


KERNEL_KEYS = ("cpu", "cpu_id", "isa", "torch", "threads", "device", "gpu")
"""The environment facts that decide which float kernels a run used (see the module docs)."""


def kernel_signature(device: str = "cpu") -> dict[str, Any]:
    """What decides this process's float kernels on ``device``: CPU model and id, the
    instruction set torch dispatches to, the torch build, its thread count, the device and —
    on CUDA — the GPU's name."""
    signature: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        signature["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return signature


def kernel_differences(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """The kernel facts (:data:`KERNEL_KEYS`) two environments do not share, as
    ``isa: 'AVX512' recorded, 'AVX2' here``; a fact the recorded one lacks (a result written
    before it was recorded) counts as differing, so an exact comparison is never assumed."""
    return [
        f"{key}: {recorded.get(key)!r} recorded, {here.get(key)!r} here"
        for key in KERNEL_KEYS
        if key in here or key in recorded
        if recorded.get(key) != here.get(key)
    ]


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
        digest.update(shard.train.fingerprint().encode())  # hashed once: a context reuses it
        if shard.val is not None:
            digest.update(shard.val.fingerprint().encode())
    if data.public is not None:
        digest.update(tensor_fingerprint(data.public.x).encode())
    digest.update(data.test.fingerprint().encode())
    return digest.hexdigest()[:16]
