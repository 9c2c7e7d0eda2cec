"""The GPU architecture a build targets: shared by the evaluation child and the CPU-only prebuild."""

from __future__ import annotations


def arch_list_for(major: int, minor: int) -> str:
    """TORCH_CUDA_ARCH_LIST for one GPU: its own arch only ("a": arch-specific features on sm_90+).

    The evaluation child and the CPU-only prebuild must agree on it: it is part of the build key.
    """
    return f"{major}.{minor}" + ("a" if major >= 9 else "")
