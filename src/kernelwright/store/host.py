"""The machine and the code a run ran with, recorded in its `run.json` (`environment`) so a report
can say where its numbers come from: kernelwright's version and git commit, the NVIDIA driver,
Python and the platform. torch, CUDA and the device are in every evaluation record's metadata."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import kernelwright


def _run(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def commit() -> str | None:
    """The git commit kernelwright's source is at (with `+dirty` for uncommitted changes), when it
    runs from a git checkout; None for an installed wheel."""
    src = Path(kernelwright.__file__).resolve().parent
    if shutil.which("git") is None:
        return None
    head = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=src)
    if head is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=src)
    return head + ("+dirty" if dirty else "")


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, else /proc/driver/nvidia/version); None without one."""
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if out:
            return out.splitlines()[0].strip()
    try:
        m = re.search(r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def host_environment() -> dict[str, str | None]:
    return {
        "kernelwright": kernelwright.__version__,
        "commit": commit(),
        "driver": nvidia_driver(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
