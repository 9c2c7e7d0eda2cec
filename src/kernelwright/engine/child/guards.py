"""Reward-hacking guards: the mechanisms (each check returns facts; the judge, `judge.py`, turns them into flags).

- `FunctionSnapshot`: identities of the timing clocks, the verifier's own functions and torch's
  public functions, taken before the candidate is imported; a later difference is a patch
  (`patched_functions`), and the originals are put back before anything is measured.
- `nan_fill`: while the candidate is checked (never while it is timed), memory from torch.empty
  and friends is filled with NaN (deterministic mode, warn-only), so outputs never written show up.
- `CallTracer`: during one guarded call, which Python code ran (code of the problem file:
  `calls_reference`), and whether a kernel of the candidate's own ran: a function of an extension
  it built, a Triton kernel it defined, a custom torch op, or (CUDA) a kernel named in its source.

Work off the timed stream, or deferred past a call's end, needs no guard of its own any more: the
judge's clock (`timing/`) ends a window only after the outputs are committed and snapshotted.
"""

from __future__ import annotations

import concurrent.futures.thread as cft
import contextlib
import os
import re
import statistics
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.core import kernel_names
from kernelwright.engine.child import compare, localize, numerics
from kernelwright.engine.child.compare import flatten
from kernelwright.engine.child.timing import summary

_CALLABLE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    type,
    staticmethod,
    classmethod,
    property,
)


def _namespaces() -> dict[str, Any]:
    """The objects whose attributes a cheat would patch to fool the timer or the verifier."""
    spaces: dict[str, Any] = {
        "time": time,
        "statistics": statistics,
        "torch": torch,
        "torch.nn.functional": torch.nn.functional,
        "torch.Tensor": torch.Tensor,
        "torch.nn.Module": torch.nn.Module,
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Stream": torch.cuda.Stream,
        "torch.linalg": torch.linalg,
        "torch.profiler": torch.profiler,
        "kernelwright.compare": compare,
        "kernelwright.numerics": numerics,
        "kernelwright.localize": localize,
        "kernelwright.timing": summary,
        "kernelwright.guards": sys.modules[__name__],
    }
    for mod_name in ("kernelwright.engine.child.runner", "kernelwright.engine.child.wire", "__main__"):
        mod = sys.modules.get(mod_name)
        if mod is not None and getattr(mod, "__name__", "").startswith(("kernelwright", "__main__")):
            spaces[mod_name] = mod
            runner = getattr(mod, "Runner", None)
            if isinstance(runner, type):
                spaces[mod_name + ".Runner"] = runner
    for cls_name in ("_Flusher",):
        cls = getattr(summary, cls_name, None)
        if cls is not None:
            spaces["kernelwright.timing." + cls_name] = cls
    return spaces


class FunctionSnapshot:
    """Who is who among the functions a cheat would patch; `changed()` names the patched ones."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], tuple[Any, Any]] = {}
        for space_name, space in _namespaces().items():
            for attr, value in list(vars(space).items()):
                if isinstance(value, _CALLABLE) or callable(value) and not isinstance(value, types.ModuleType):
                    self.items[(space_name, attr)] = (space, value)

    def changed(self) -> list[str]:
        out = []
        for (space_name, attr), (space, value) in self.items.items():
            now = vars(space).get(attr, _MISSING)
            if now is not value and not _torch_own_wrapper(now):
                out.append(f"{space_name}.{attr}")
        return out

    def restore(self) -> None:
        for (space_name, attr), (space, value) in self.items.items():  # noqa: B007
            if vars(space).get(attr, _MISSING) is not value:
                try:
                    setattr(space, attr, value)
                except (AttributeError, TypeError):
                    pass


_MISSING = object()
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


def _torch_own_wrapper(now: Any) -> bool:
    """torch replaces some of its own functions lazily (torch._dynamo wraps torch.manual_seed and
    nn.Module.__init__ on first use): a replacement whose code lives in torch's package is not a patch."""
    code = getattr(now, "__code__", None) or getattr(getattr(now, "__func__", None), "__code__", None)
    return code is not None and os.path.realpath(code.co_filename).startswith(_TORCH_DIR)


@contextlib.contextmanager
def nan_fill(enabled: bool) -> Iterator[None]:
    """Fill uninitialised memory (torch.empty, empty_like, resize_) with NaN while enabled."""
    if not enabled:
        yield
        return
    import torch.utils.deterministic as det  # (a lazy torch import: only where NaN fill is on)

    prev_mode = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = det.fill_uninitialized_memory
    # torch.use_deterministic_algorithms also imports torch._inductor (seconds): set the flag directly
    set_mode = getattr(torch._C, "_set_deterministic_algorithms", None) or torch.use_deterministic_algorithms
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        set_mode(True, warn_only=True)
        det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            set_mode(prev_mode, warn_only=prev_warn)
            det.fill_uninitialized_memory = prev_fill


# ---- what ran inside one call ------------------------------------------------------------------

_BUILTIN_OP_NS = {
    "aten",
    "prim",
    "prims",
    "profiler",
    "autograd",
    "c10d",
    "_c10d_functional",
    "cuda",
    "inductor",
    "quantized",
    "torch",
    "torchvision",
    "mkldnn",
    "_quantized",
    "triton",
    "Optimizer",
    "nccl",
}
_OP_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)::[A-Za-z_]")
_KERNEL_IDENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:<|\()")


@dataclass
class CallFacts:
    problem_code: list[str] = field(default_factory=list)  # functions of the problem file that ran
    extension_calls: list[str] = field(default_factory=list)  # functions of the candidate's extensions
    triton_kernels: list[str] = field(default_factory=list)  # Triton kernels of the candidate launched
    custom_ops: list[str] = field(default_factory=list)  # non-builtin torch ops seen by the profiler
    own_cuda_kernels: list[str] = field(default_factory=list)  # CUDA kernels named in the candidate's source
    kernels: list[str] = field(default_factory=list)  # every device kernel seen (CUDA), first ones
    profiler_error: str = ""

    @property
    def custom_kernel(self) -> bool:
        return bool(self.extension_calls or self.triton_kernels or self.custom_ops or self.own_cuda_kernels)


class CallTracer:
    """sys.setprofile (and optionally torch.profiler) around one call of the candidate."""

    def __init__(
        self,
        problem_path: str,
        candidate_path: str,
        ext_names: set[str],
        ext_dirs: list[str],
        candidate_text: str,
        use_profiler: bool,
        device: torch.device,
    ):
        self.problem_path = os.path.realpath(problem_path)
        self.candidate_path = os.path.realpath(candidate_path)
        self.ext_names = ext_names
        self.ext_dirs = [os.path.realpath(d) for d in ext_dirs if d]
        self.candidate_text = candidate_text
        self.own_kernel_names = kernel_names.candidate_kernel_names([candidate_text])
        self.use_profiler = use_profiler
        self.device = device
        self.facts = CallFacts()
        self._files: dict[str, str] = {}

    def _real(self, filename: str) -> str:
        r = self._files.get(filename)
        if r is None:
            r = self._files[filename] = (
                os.path.realpath(filename) if filename and not filename.startswith("<") else filename
            )
        return r

    def _is_extension(self, func: Any) -> bool:
        mod_name = getattr(func, "__module__", None)
        if not isinstance(mod_name, str):
            return False
        if mod_name in self.ext_names:
            return True
        mod = sys.modules.get(mod_name)
        path = getattr(mod, "__file__", None) or ""
        return bool(path) and any(os.path.realpath(path).startswith(d + os.sep) for d in self.ext_dirs)

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            fname = self._real(code.co_filename)
            if fname == self.problem_path:
                name = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
                if name not in self.facts.problem_code:
                    self.facts.problem_code.append(name)
            elif (
                "triton" in fname
                and code.co_name in ("run", "__call__")
                and fname.endswith(os.path.join("runtime", "jit.py"))
            ):
                fn = getattr(frame.f_locals.get("self"), "fn", None)
                src = getattr(getattr(fn, "__code__", None), "co_filename", "")
                if src and self._real(src) == self.candidate_path:
                    kname = getattr(fn, "__name__", "?")
                    if kname not in self.facts.triton_kernels:
                        self.facts.triton_kernels.append(kname)
        elif event == "c_call":
            if self._is_extension(arg):
                name = f"{arg.__module__}.{getattr(arg, '__name__', '?')}"
                if name not in self.facts.extension_calls:
                    self.facts.extension_calls.append(name)

    def run(self, fn: Callable[[], Any]) -> Any:
        prof = None
        if self.use_profiler:
            try:
                # the autograd profiler: torch.profiler would import torch._dynamo (seconds on a CPU)
                from torch.autograd.profiler import profile

                prof = profile(use_device="cuda") if self.device.type == "cuda" else profile()
                prof.__enter__()
            except Exception as exc:  # the profiler is optional evidence
                self.facts.profiler_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                prof = None
        prev = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            out = fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            sys.setprofile(prev)
            if prof is not None:
                try:
                    prof.__exit__(None, None, None)
                    self._read_profile(prof)
                except Exception as exc:
                    self.facts.profiler_error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out

    def _kernel(self, name: str) -> None:
        if len(self.facts.kernels) < 50 and name not in self.facts.kernels:
            self.facts.kernels.append(name)
        # own = a kernel the candidate's source defines (__global__ / @triton.jit), by the shared classifier
        if kernel_names.classify(name, self.own_kernel_names) == kernel_names.CANDIDATE:
            if name not in self.facts.own_cuda_kernels:
                self.facts.own_cuda_kernels.append(name)

    def _read_profile(self, prof: Any) -> None:
        for evt in prof.function_events:
            name = evt.name
            for k in getattr(evt, "kernels", None) or []:
                self._kernel(getattr(k, "name", str(k)))
            dev = str(getattr(evt, "device_type", "")).lower()
            if "cuda" in dev:
                self._kernel(name)
                continue
            m = _OP_NAME.match(name)
            if m and m.group(1) not in _BUILTIN_OP_NS and name not in self.facts.custom_ops:
                self.facts.custom_ops.append(name)


def tensors(obj: Any) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in flatten(obj) if isinstance(t, torch.Tensor)]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(
            torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
            and torch.equal(torch.isnan(a), torch.isnan(b))
        )
    return bool(torch.equal(a, b))


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    try:
        return (str(t.device), t.untyped_storage().data_ptr())
    except Exception:
        return (str(t.device), t.data_ptr())


def refill_in_place(inputs: Any, fresh: Any) -> int:
    """Copy `fresh` values into `inputs`' tensors (same objects, same addresses); returns how many."""
    n = 0
    for (_, dst), (_, src) in zip(tensors(inputs), tensors(fresh), strict=False):
        if dst.shape == src.shape:
            dst.copy_(src)
            n += 1
    return n


# Threads that libraries start for themselves (torch.compile's compile workers, tqdm's monitor).
_LIBRARY_THREAD_MODULES = ("torch", "triton", "tqdm")


def _library_thread(t: threading.Thread) -> bool:
    """A thread a library started for itself: its class is the library's own, or its target is a
    method of one of the library's objects (a bare library function as target does not count:
    `Thread(target=torch.relu, ...)` from a candidate is still the candidate's thread)."""
    if (type(t).__module__ or "").split(".")[0] in _LIBRARY_THREAD_MODULES:
        return True
    target = getattr(t, "_target", None)
    owner = getattr(target, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType) or not hasattr(target, "__func__"):
        return False
    func = getattr(target, "__func__", None)
    return (getattr(func, "__module__", "") or "").split(".")[0] in _LIBRARY_THREAD_MODULES


def _torch_compile_pool_worker(t: threading.Thread) -> bool:
    """A worker of torch.compile's own compile-thread pool (inductor's `AsyncCompile.pool()`): the
    pool outlives the compile, so `torch.compile` of the reference would look like escaped work."""
    if getattr(t, "_target", None) is not getattr(cft, "_worker", object()):
        return False
    mod = sys.modules.get("torch._inductor.async_compile")
    pool = getattr(getattr(mod, "AsyncCompile", None), "pool", None)
    try:
        if pool is None or not pool.cache_info().currsize:  # never created: calling it would create it
            return False
        ref = vars(t)["_args"][0]  # a weak reference to the thread's executor (Thread's private field)
        return ref() is pool()
    except Exception:
        return False


def python_threads() -> set[threading.Thread]:
    """Live threads, less those a library (torch, triton, tqdm) started for its own work."""
    return {
        t
        for t in threading.enumerate()
        if t.is_alive() and not _library_thread(t) and not _torch_compile_pool_worker(t)
    }


def autotuning() -> list[str]:
    """Process-wide autotuning turned on in this process (torch's default: off): a speed that is a
    draw of the algorithms timed in it. In the runner, the candidate's word: a report, no verdict."""
    import torch  # (a lazy torch import, as above)

    try:
        return ["torch.backends.cudnn.benchmark"] if torch.backends.cudnn.benchmark is True else []
    except Exception:  # torch.backends replaced by the candidate: nothing to say
        return []
