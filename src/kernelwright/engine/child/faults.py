"""Whose fault is an exception: the candidate's, or the engine's own (`engine_error`).

The child runs candidate code inside engine code (checks, guards, numerics). An exception that
reaches the evaluation's last-resort handler is classified here:

1. a frame of code that is neither kernelwright's, torch's, the standard library's nor the
   problem's ran when it was raised: the candidate's code raised (`runtime_error`, as always);
2. otherwise, on a GPU, a CUDA error: torch raised it for an error the candidate's kernels left
   behind (a launch with a bad configuration is reported by the *next* launch, whoever makes
   it): the candidate's, said in plain words, "the candidate left a CUDA error pending: ...";
3. otherwise: a bug in kernelwright. Status `engine_error`, never a pass, never blamed on the
   candidate; the traceback goes to `metadata["engine_traceback"]`.

`sync_and_check` is called right after the candidate's calls so that a pending CUDA error is
caught where it happens (and attributed there) rather than in the next engine operation.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelwright.core.record import Status

if TYPE_CHECKING:
    import torch

_CUDA_ERROR_MARKS = (
    "CUDA error",
    "cudaError",
    "device-side assert",
    "illegal memory access",
    "an illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "CUDA driver error",
)

_PENDING = "the candidate left a CUDA error pending"


class PendingCudaError(RuntimeError):
    """A CUDA error found right after the candidate's calls: the candidate's kernels caused it."""


def _is_cuda_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(m in text for m in _CUDA_ERROR_MARKS) or type(exc).__name__ in ("AcceleratorError", "CudaError")


_probes: dict[Any, Any] = {}


def sync_and_check(device: torch.device | str) -> None:
    """Synchronise and surface a CUDA error the candidate left behind, as `PendingCudaError`.

    `torch.cuda.synchronize` reports errors of kernels that ran; a launch error (an invalid grid,
    too much shared memory) is only reported to the next launch's check, so one tiny kernel is
    launched and synchronised too. No-op on the CPU.
    """
    if getattr(device, "type", device) != "cuda":
        return
    import torch

    try:
        torch.cuda.synchronize(device)
        probe = _probes.get(device)
        if probe is None:
            probe = _probes[device] = torch.zeros(1, device=device)
        probe.add_(1)  # a launch: torch checks cudaGetLastError right after it
        torch.cuda.synchronize(device)
    except Exception as exc:
        if not _is_cuda_error(exc):
            raise
        raise PendingCudaError(f"{_PENDING}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _roots() -> tuple[str, ...]:
    import kernelwright

    own = kernelwright.__file__
    assert own is not None  # a regular package: imported from its __init__.py
    roots = [os.path.dirname(os.path.realpath(own))]
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    if torch_file is not None:
        roots.append(os.path.dirname(os.path.realpath(torch_file)))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.append(os.path.realpath(p))
    return tuple(r + os.sep for r in roots)


def candidate_frames(
    exc: BaseException, problem_path: str | None = None, candidate_objects: tuple[Any, ...] = ()
) -> list[str]:
    """Where the candidate's code was running when `exc` was raised (empty: it was not).

    A frame counts when its file is not kernelwright's, torch's, an installed library's, the
    standard library's or the problem's (the candidate file, code it exec'd), or when its `self`
    is one of `candidate_objects` (ModelNew and its submodules: a candidate made only of torch
    modules raises from torch's frames, called on the candidate's module).
    """
    roots = _roots()
    problem = os.path.realpath(problem_path) if problem_path else None
    ids = {id(o) for o in candidate_objects}
    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the chain too: `raise X from candidate_error`
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            f = frame.f_code.co_filename
            real = os.path.realpath(f) if f and not f.startswith("<") else f
            if ids and id(frame.f_locals.get("self")) in ids:
                out.append(f"{f}:{tb.tb_lineno} (called on ModelNew)")
            elif not (real == problem or f.startswith("<frozen") or (real and real.startswith(roots))):
                out.append(f"{f}:{tb.tb_lineno}")
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return out


@dataclass
class Blame:
    status: Status
    log: str
    metadata: dict[str, Any] = field(default_factory=dict)


def classify(
    exc: BaseException,
    device_type: str,
    problem_path: str | None = None,
    short_tb: str = "",
    candidate_objects: tuple[Any, ...] = (),
) -> Blame:
    """Whose fault `exc` is (see the module docstring); `short_tb`: the trimmed traceback for the log."""
    tb = short_tb or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, PendingCudaError):
        return Blame(Status.RUNTIME_ERROR, f"{exc}\n{tb}")
    if candidate_frames(exc, problem_path, candidate_objects):
        return Blame(Status.RUNTIME_ERROR, tb)
    if device_type == "cuda" and _is_cuda_error(exc):
        return Blame(
            Status.RUNTIME_ERROR,
            f"{_PENDING}: {_first_line(exc)}\n(it surfaced in the engine's next CUDA operation "
            f"after the candidate's kernels ran)\n{tb}",
        )
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Blame(
        Status.ENGINE_ERROR,
        f"kernelwright's own code failed ({type(exc).__name__}: {_first_line(exc)}); this is an engine bug, "
        "not the candidate's fault: the traceback is in metadata['engine_traceback']",
        {"engine_traceback": full[-20000:]},
    )


TRACEBACK_LINES = 40


def short_tb(exc: BaseException) -> str:
    """The exception and the frames worth reading, trimmed."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    out = text.splitlines()
    if len(out) > TRACEBACK_LINES:
        out = out[:5] + ["  ..."] + out[-(TRACEBACK_LINES - 6) :]
    return "\n".join(out)


def is_triton_compile_error(exc: BaseException) -> bool:
    """Triton's compiler raised it (the candidate's kernel did not compile), not its launch."""
    mod = type(exc).__module__ or ""
    return mod.startswith("triton.compiler") or type(exc).__name__ in (
        "CompilationError",
        "CompileTimeAssertionFailure",
    )


def tail(text: str, n: int) -> str:
    """The last `n` lines of `text`."""
    return "\n".join(text.rstrip().splitlines()[-n:])
