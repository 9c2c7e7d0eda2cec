"""The configuration resolved once, at an entry point: `resolve_config(config)` makes "auto" concrete.

The command line, `kernelwright.evaluate`/`optimize` and the executors call it; everything below
them (the evaluation, its builders, the isolation, the children) takes the resolved configuration
and refuses a raw "auto" (`EvalConfig.check_resolved`).

- device: `auto` is cuda when torch sees a GPU, else cpu; cuda without a GPU is an `EngineError`.
- sandbox: `auto` is bwrap when bubblewrap is installed and runs a trivial command with the
  evaluation's options (`isolation/sandbox.py`, probed once per process), else none; bwrap asked
  for where it cannot run is an `EngineError`.
"""

from __future__ import annotations

import copy
import ctypes
import glob
import importlib.util
import re
from pathlib import Path

from kernelwright.core.config import Device, EvalConfig, ResolvedDevice, ResolvedSandbox, SandboxMode
from kernelwright.engine.errors import EngineError
from kernelwright.engine.isolation import sandbox

_CUDA_ERROR_NO_DEVICE = 100  # cuInit's answer where no device is visible

# Device nodes without which the CUDA driver sees no GPU (Linux; /dev/dxg under WSL 2).
_GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg")


def _torch_cuda_build() -> tuple[int, int] | None | bool:
    """The CUDA version torch was built for, read from its `version.py` (never imported here):
    (major, minor); False for a build without CUDA; None where it cannot tell (ROCm, no torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    if re.search(r"^hip\s*(?::[^=]*)?=\s*['\"]", text, re.MULTILINE):
        return None
    if re.search(r"^cuda\s*(?::[^=]*)?=\s*None", text, re.MULTILINE):
        return False
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.(\d+)", text, re.MULTILINE)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _gpu_without_torch() -> bool | None:
    """Does torch see a GPU? Answered from the driver (libcuda: cuInit, cuDeviceGetCount, which
    honour CUDA_VISIBLE_DEVICES) and torch's build, without importing torch: `import torch` in the
    CLI's own process cost 3-4 s on an H100 machine before any child could start. None where this
    cannot tell (torch is then asked): no readable build, a driver older than the build's CUDA."""
    build = _torch_cuda_build()
    if build is None or build is True:
        return None
    if build is False:
        return False
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False  # no driver: torch sees no GPU either
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    rc = lib.cuInit(0)
    if rc == _CUDA_ERROR_NO_DEVICE:  # none visible (CUDA_VISIBLE_DEVICES="" among others)
        return False
    if rc != 0 or lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    if version.value // 1000 < build[0]:
        return None
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return count.value > 0


def _torch_sees_gpu() -> bool:
    quick = _gpu_without_torch()
    if quick is not None:
        return quick
    import torch

    return bool(torch.cuda.is_available())


def check_device(device: str) -> None:
    """cuda asked for where torch sees no GPU is an EngineError."""
    if device == "cuda":
        if not _torch_sees_gpu():
            raise EngineError(
                "--device cuda was asked for but no CUDA GPU is visible; use --device cpu or run on a GPU machine"
            )


def resolve_device(device: Device) -> ResolvedDevice:
    """`auto`: cuda when torch sees a GPU, else cpu, asked of the driver without importing torch in
    this process where it can (`_gpu_without_torch`: 3-4 s saved before any child can start). cuda
    without a GPU raises EngineError."""
    resolved: ResolvedDevice
    if device == "auto":
        if not any(glob.glob(pattern) for pattern in _GPU_NODES):
            resolved = "cpu"
        else:
            resolved = "cuda" if _torch_sees_gpu() else "cpu"
    elif device in ("cuda", "cpu"):
        resolved = device
    else:
        raise EngineError(f"--device must be auto, cuda or cpu (got {device!r})")
    check_device(resolved)
    return resolved


def resolve_sandbox(mode: SandboxMode) -> ResolvedSandbox:
    """`auto`: bwrap where it runs, else none. bwrap where it cannot run raises EngineError."""
    try:
        return sandbox.resolve(mode)
    except sandbox.SandboxUnavailable as exc:
        raise EngineError(str(exc)) from None


def resolve_config(config: EvalConfig) -> EvalConfig:
    """A copy of `config` with device and sandbox concrete (the caller's own is left as it was, so a
    run can still record what was asked). Validates first; every error is an `EngineError`, one line."""
    try:
        config.validate()
    except ValueError as exc:
        raise EngineError(str(exc)) from None
    resolved = copy.deepcopy(config)
    resolved.device = resolve_device(config.device)
    resolved.sandbox = resolve_sandbox(config.sandbox)
    return resolved
