"""The build recorder: the `load_inline` (and `load`) calls a candidate makes when its code runs.

    python -m kernelwright.engine.child.build_recorder JOB.json

For a candidate whose `load_inline` arguments are computed at run time (f-strings, functions,
loops), `engine/extensions/static_builds.py` cannot resolve the calls from the text. This child imports the
candidate with `load_inline` replaced by a recorder that keeps each call's arguments and hands
back a stub module (nothing is compiled, nothing is loaded), then reports the calls. It runs
candidate code, so it gets what a build-only child gets: no GPU (`CUDA_VISIBLE_DEVICES=""`), the
evaluation's filtered environment (no secrets), the sandbox (no network under bubblewrap), and
the parent treats what it reports as hostile input (`static_builds.check_recorded`: the same
argument and flag allow-lists as a call read from the text). The trusted builder then builds the
accepted calls into the shared cache, as it builds the static ones.

Many candidates build lazily: in `ModelNew.__init__`, or at the first `forward` (a global
extension set on first use). Where the job names the problem (`problem_path`: the reference the
Coder was shown, no secret), the recorder then goes on: it constructs `ModelNew` from the problem's
`get_init_inputs()` and calls it once on `get_inputs()` (on the CPU, seeded with 0), recording every
call made on the way and stopping at the first error (a recorded extension's functions raise).
`torch.cuda.is_available()` answers True here, for candidates that build only where CUDA is, and
what they ask for on CUDA is made on the CPU (`_pretend_cuda`). Best effort: a candidate whose CPU
path never builds (one that checks `x.is_cuda` first) still builds in its evaluation. One whose
extension's name changes from process to process (`f"ext_{id(self)}"`) is served all the same: a
build's key leaves the name out (`child/build.py`, `_same_build`).

Reports on the job's `fd`: a `call` message per recorded call as it is made (a recorder stopped at
its time limit has still reported those), then one final record
`{"calls": [{load_inline keyword arguments}, ...]}`.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

MAX_CALLS = 16
CONSTRUCT_AND_CALL_S = 30  # the construct-and-call step stops here (between two Python steps)


class _Stub:
    """What a recorded load_inline returns: any function of it says it was only recorded."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Callable[..., NoReturn]:
        def not_built(*args: Any, **kwargs: Any) -> NoReturn:
            raise RuntimeError(f"extension {self._name!r} was only recorded, not built")

        return not_built


def main(job_path: str) -> int:
    from kernelwright.engine.child import heap

    heap.keep_tunables_to_itself()  # (glibc's setting stays with this process; the compilers it starts go without)
    with open(job_path) as f:
        job = json.load(f)
    fd = job.get("fd")
    calls: list[dict[str, Any]] = []

    def send(kind: str, **payload: Any) -> None:
        if fd is None:
            return
        data = (json.dumps({"type": kind, "t": time.time(), **payload}, default=repr) + "\n").encode()
        while data:
            data = data[os.write(fd, data) :]

    import torch.utils.cpp_extension as cpp_ext

    original = cpp_ext.load_inline

    def record(*args: Any, **kwargs: Any) -> _Stub:
        try:
            bound = inspect.signature(original).bind(*args, **kwargs)
            call = dict(bound.arguments)
        except TypeError:
            call = {}
        if call and len(calls) < MAX_CALLS:
            calls.append(call)
            send("call", call=call)
        return _Stub(str(call.get("name", "extension")))

    original_load = cpp_ext.load

    def record_load(*args: Any, **kwargs: Any) -> _Stub:
        """load(name, sources=[files]): the files are read now (the candidate has just written them)
        and recorded by name and text; the trusted builder writes them into a directory of its own."""
        try:
            call = dict(inspect.signature(original_load).bind(*args, **kwargs).arguments)
            sources = call.pop("sources")
        except (TypeError, KeyError):
            call, sources = {}, []
        files = []
        for path in [sources] if isinstance(sources, str) else list(sources):
            # a file not written yet fails here as it fails in torch's own load (which reads every
            # source first): a candidate that writes its files in the `except` of a first attempt
            # then makes the call worth recording
            with open(path, errors="replace") as f:
                files.append([os.path.basename(str(path)), f.read()])
        if call:
            call["load_sources"] = files
        if call and len(calls) < MAX_CALLS:
            calls.append(call)
            send("call", call=call)
        return _Stub(str(call.get("name", "extension")))

    cpp_ext.load_inline = record
    cpp_ext.load = record_load
    # no GPU is visible here, yet many candidates build only `if torch.cuda.is_available()`: the
    # recorder answers yes, so that those calls are made (what fails after them does not matter);
    # a module that cannot be imported so (CUDA tensors made at import) is imported as it is
    import torch

    really_available = torch.cuda.is_available
    module = None
    for pretend in (True, False):
        torch.cuda.is_available = (lambda: True) if pretend else really_available
        cuda_as_cpu = _pretend_cuda(torch) if pretend else None
        try:
            spec = importlib.util.spec_from_file_location("kw_candidate", job["candidate_path"])
            if spec is None or spec.loader is None:
                raise ImportError(f"{job['candidate_path']} cannot be imported as a module")
            module = importlib.util.module_from_spec(spec)
            sys.modules["kw_candidate"] = module
            spec.loader.exec_module(module)
            break
        except BaseException:  # what came after the calls does not matter here
            module = None
            if cuda_as_cpu is not None:
                cuda_as_cpu.__exit__(None, None, None)
                cuda_as_cpu = None
    if module is not None and job.get("problem_path"):
        _construct_and_call(module, job["problem_path"])
    send("final", record={"calls": calls})
    return 0


def _pretend_cuda(torch: Any) -> Any:
    """Until the recorder ends: tensors and modules asked for on CUDA stay on the CPU (`.cuda()`,
    `.to("cuda")`, `device="cuda"` in a factory), and the few torch.cuda questions a candidate asks
    before it builds are answered as a GPU would. Many candidates make a CUDA tensor in `__init__`
    before their build (a weight moved with `.cuda()`): without this the recorder stops there, and
    the build lands on the GPU's path in the evaluation. Best effort; what fails later does not matter."""
    from torch.overrides import TorchFunctionMode

    def is_cuda(value: Any) -> bool:
        if isinstance(value, torch.device):
            return bool(value.type == "cuda")
        return isinstance(value, str) and value.split(":")[0] == "cuda"

    class CudaAsCpu(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if name == "cuda" and args and isinstance(args[0], torch.Tensor):
                return args[0]
            if is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            if name == "to":
                args = tuple("cpu" if is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    for attr, answer in (
        ("current_device", lambda: 0),
        ("device_count", lambda: 1),
        ("synchronize", lambda *a, **k: None),
        ("get_device_capability", lambda *a, **k: (9, 0)),
        ("get_device_name", lambda *a, **k: "the build recorder's pretend GPU"),
    ):
        setattr(torch.cuda, attr, answer)
    mode = CudaAsCpu()
    mode.__enter__()
    return mode


def _construct_and_call(candidate: Any, problem_path: str) -> None:
    """ModelNew from the problem's init inputs, then one call on its inputs (CPU, seed 0): the
    builds made lazily are recorded on the way. Stops quietly at the first error."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        raise TimeoutError("the recorder's construct-and-call step took too long")

    signal.signal(signal.SIGALRM, stop)
    signal.alarm(CONSTRUCT_AND_CALL_S)  # a big problem's forward on the CPU: the prebuild must not wait for it
    try:
        import torch

        spec = importlib.util.spec_from_file_location("kw_problem", problem_path)
        if spec is None or spec.loader is None:
            return
        problem = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(problem)
        torch.manual_seed(0)
        model = candidate.ModelNew(*problem.get_init_inputs())
        torch.manual_seed(0)
        inputs = problem.get_inputs()
        with torch.no_grad():
            model(*inputs)
    except BaseException:
        pass
    finally:
        signal.alarm(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
