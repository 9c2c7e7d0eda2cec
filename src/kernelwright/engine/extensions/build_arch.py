"""Which CUDA architectures the builds target (TORCH_CUDA_ARCH_LIST): the caller's own setting,
else the first visible GPU's, found without creating a CUDA context in this process."""

from __future__ import annotations

import os
import subprocess

from kernelwright.core.arch import arch_list_for
from kernelwright.core.config import EvalConfig


def detect_arch_list() -> str | None:
    """TORCH_CUDA_ARCH_LIST for the first visible GPU, without creating a CUDA context here.

    The caller's own TORCH_CUDA_ARCH_LIST wins, as it does in the evaluation child: the two must
    agree, or a prebuild lands under another cache key than the evaluation looks for.
    """
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        first = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        major, minor = (int(x) for x in first.strip().split("."))
        return arch_list_for(major, minor)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return arch_list_for(*torch.cuda.get_device_capability(0))
    except Exception:
        pass
    return None


def arch_list_for_config(config: EvalConfig) -> str | None:
    """TORCH_CUDA_ARCH_LIST the evaluation child will build with (None: the caller's, or a CPU build)."""
    if config.device == "cpu" or os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ.get("TORCH_CUDA_ARCH_LIST")
    return _arch_cached()


_ARCH: list[str | None] = []


def _arch_cached() -> str | None:
    if not _ARCH:
        _ARCH.append(detect_arch_list())
    return _ARCH[0]
