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
import glob

from kernelwright.core.config import Device, EvalConfig, ResolvedDevice, ResolvedSandbox, SandboxMode
from kernelwright.engine.errors import EngineError
from kernelwright.engine.isolation import sandbox

# Device nodes without which the CUDA driver sees no GPU (Linux; /dev/dxg under WSL 2).
_GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg")


def check_device(device: str) -> None:
    """cuda asked for where torch sees no GPU is an EngineError."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EngineError(
                "--device cuda was asked for but no CUDA GPU is visible; use --device cpu or run on a GPU machine"
            )


def resolve_device(device: Device) -> ResolvedDevice:
    """`auto`: cuda when torch sees a GPU, else cpu; a machine with no GPU device node is cpu without
    importing torch in this process (a second or more, before any child can start). cuda without a
    GPU raises EngineError."""
    resolved: ResolvedDevice
    if device == "auto":
        if not any(glob.glob(pattern) for pattern in _GPU_NODES):
            resolved = "cpu"
        else:
            import torch

            resolved = "cuda" if torch.cuda.is_available() else "cpu"
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
