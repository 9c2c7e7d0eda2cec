"""The profile stage of the evaluation child: what a correct candidate's forward launches, and
the numbers for the roofline. torch + standard library only.

- `torch_profile`: one forward of the candidate under `torch.profiler`. Calls into the candidate's
  own extension functions are labelled (`kw::candidate:<extension>.<function>`) for the duration
  of the profile, so on the CPU the candidate's ops are told apart from PyTorch's (`aten::...`);
  on a GPU every kernel is listed with its time and launch count and classified by name
  (`kernel_names.classify`).
- `reference_work`: FLOPs of the reference (`torch.utils.flop_counter.FlopCounterMode`) and its
  minimal traffic (inputs and parameters read once, outputs written once).
- `collect`: both of those plus the device's facts and peaks, and the roofline of the measured
  candidate time. Never raises: a part that fails is recorded as `<part>_error`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from kernelwright.core import kernel_names, roofline
from kernelwright.core.config import EvalConfig
from kernelwright.engine.child import gpu_facts, jsoncache

MAX_ENTRIES = 40  # kernels / ops kept in the record (the rest are summed into "other")
NAME_CHARS = 300


def _tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


_PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def warm_flop_counter() -> None:
    """The flop counter's first use, on two small matrices: it imports torch._dynamo (2-5 s of
    CPU, once per process), which `reference_work` would otherwise pay at the first evaluation of
    every new problem. Called off the path: in a GPU judge's start-up thread, in the CPU judges'
    zygote when its parent is idle (engine/child/zygote.py), and in a CPU judge's thread once its
    problem is loaded, where that problem's work is not cached and nothing warmed its process
    (`JudgeTiming.warm_if_uncounted`).
    Never raises."""
    try:
        # imported here on purpose: this import (torch._dynamo) is the work done off the path
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False):
            torch.ones(2, 2) @ torch.ones(2, 2)
    except Exception:
        pass


def reference_work(ref_model: torch.nn.Module, inputs: Any) -> dict[str, Any]:
    """FLOPs and minimal bytes of one reference forward, and its dominant floating precision."""
    # (imported here: the flop counter imports torch._dynamo, seconds, only where the work is counted)
    warm = "torch._dynamo" in sys.modules  # (else this count pays its import: `warm_flop_counter`)
    t0 = time.perf_counter()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = ref_model(*inputs)
    count_s = time.perf_counter() - t0
    by_op = {str(k): int(v) for k, v in counter.get_flop_counts().get("Global", {}).items()}
    read = list(_tensors(inputs)) + list(ref_model.parameters()) + list(ref_model.buffers())
    seen: set[int] = set()
    in_bytes = 0
    for t in read:
        key = t.data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen.add(key)
        in_bytes += t.numel() * t.element_size()
    out_bytes = sum(t.numel() * t.element_size() for t in _tensors(out))
    by_dtype: dict[str, int] = {}
    for t in read + list(_tensors(out)):
        if t.is_floating_point():
            p = _PRECISION.get(t.dtype, str(t.dtype))
            by_dtype[p] = by_dtype.get(p, 0) + t.numel() * t.element_size()
    precision = max(by_dtype, key=lambda p: by_dtype[p]) if by_dtype else "fp32"
    return {
        "flops": int(counter.get_total_flops()),
        "flops_by_op": by_op,
        "input_bytes": in_bytes,
        "output_bytes": out_bytes,
        "min_bytes": in_bytes + out_bytes,
        "precision": precision,
        "flop_counter": "torch.utils.flop_counter (matmul/conv/attention; elementwise ops count 0)",
        "counter_warm": warm,
        "count_s": round(count_s, 4),
    }


def _wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    def labelled(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return functools.update_wrapper(labelled, fn, assigned=(), updated=())  # sets `__wrapped__` only


@contextlib.contextmanager
def label_candidate_calls(modules: list[tuple[str, Any]], candidate_module: Any = None) -> Iterator[int]:
    """While active, every function of the candidate's extensions runs inside a labelled range."""
    patched: list[tuple[Any, str, Any]] = []
    wrapped_by_id: dict[int, Any] = {}
    try:
        for ext_name, mod in modules:
            for attr in dir(mod):
                if attr.startswith("_"):
                    continue
                fn = getattr(mod, attr, None)
                if not callable(fn) or type(fn).__name__ != "builtin_function_or_method":
                    continue
                w = _wrap(fn, kernel_names.cpu_op_label(ext_name, attr))
                wrapped_by_id[id(fn)] = w
                setattr(mod, attr, w)
                patched.append((mod, attr, fn))
        if candidate_module is not None:  # `fn = ext.fn` bound at import time
            for attr, val in list(vars(candidate_module).items()):
                if id(val) in wrapped_by_id:
                    setattr(candidate_module, attr, wrapped_by_id[id(val)])
                    patched.append((candidate_module, attr, val))
        yield len(patched)
    finally:
        for obj, attr, fn in reversed(patched):
            try:
                setattr(obj, attr, fn)
            except Exception:
                pass


def _aggregate(items: Iterable[tuple[str, float, str]]) -> list[dict[str, Any]]:
    agg: OrderedDict[str, dict[str, Any]] = OrderedDict()
    for name, us, origin in items:
        e = agg.setdefault(name, {"name": name[:NAME_CHARS], "origin": origin, "count": 0, "total_us": 0.0})
        e["count"] += 1
        e["total_us"] += us
    out = sorted(agg.values(), key=lambda e: -e["total_us"])
    for e in out:
        e["mean_us"] = e["total_us"] / e["count"]
    if len(out) > MAX_ENTRIES:
        rest = out[MAX_ENTRIES:]
        out = out[:MAX_ENTRIES] + [
            {
                "name": f"({len(rest)} more)",
                "origin": "mixed",
                "count": sum(e["count"] for e in rest),
                "total_us": sum(e["total_us"] for e in rest),
                "mean_us": 0.0,
            }
        ]
    return out


def _summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for origin in (kernel_names.CANDIDATE, kernel_names.PYTORCH, kernel_names.UNKNOWN):
        sel = [e for e in entries if e["origin"] == origin]
        s[origin] = {
            "distinct": len(sel),
            "launches": sum(e["count"] for e in sel),
            "total_us": sum(e["total_us"] for e in sel),
        }
    return s


def torch_profile(
    cand_model: torch.nn.Module,
    inputs: Any,
    device: torch.device,
    candidate_texts: list[str],
    build_dirs: list[str],
    modules: list[tuple[str, Any]],
    candidate_module: Any = None,
) -> dict[str, Any]:
    """Every op (CPU) or kernel (CUDA) one forward of the candidate launches, with its origin."""
    # (imported here: torch.profiler imports torch._dynamo, seconds, only where a profile is taken)
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        cand_model(*inputs)  # warm: lazy initialisation stays out of the profile
        if cuda:
            torch.cuda.synchronize(device)
        with label_candidate_calls(modules, candidate_module) as n_labelled:
            with profile(activities=activities) as prof:
                with record_function("kw::forward"):
                    cand_model(*inputs)
                if cuda:
                    torch.cuda.synchronize(device)
    events = list(prof.events())
    root = next((e for e in events if e.name == "kw::forward"), None)
    known = kernel_names.candidate_kernel_names(candidate_texts)
    binaries = kernel_names.read_binaries(build_dirs) if cuda else []

    top = list(root.cpu_children) if root is not None else []
    ops = _aggregate((e.name, float(e.cpu_time_total), kernel_names.classify(e.name, known)) for e in top)
    inner: list[tuple[str, float, str]] = []
    for e in top:
        if e.name.startswith("kw::candidate:"):
            inner.extend((c.name, float(c.cpu_time_total), kernel_names.PYTORCH) for c in e.cpu_children)
    rec: dict[str, Any] = {
        "source": "torch.profiler",
        "device_type": device.type,
        "ops": ops,
        "ops_called_by_candidate": _aggregate(inner),
        "labelled_functions": n_labelled,
        "candidate_kernel_names": sorted(known),
    }
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        rec["kernels"] = _aggregate(
            (e.name, float(e.time_range.elapsed_us()), kernel_names.classify(e.name, known, binaries)) for e in kernels
        )
        rec["summary"] = _summary(rec["kernels"])
    else:
        rec["summary"] = _summary(ops)
    return rec


def work_cache_path(
    cache_dir: str, device: torch.device, problem_path: str | None = None, problem_text: str | None = None
) -> Path | None:
    """Where the judge's cache keeps a problem's `reference_work` (by its text, the device type and
    torch's version), or None where the problem has no text to key it by."""
    if problem_text is not None:
        text = problem_text.encode()
    elif problem_path:
        try:
            text = Path(problem_path).read_bytes()
        except OSError:
            return None
    else:
        return None
    key = hashlib.sha256(text + f"|{device.type}|{torch.__version__}".encode()).hexdigest()[:20]
    return Path(cache_dir) / jsoncache.JUDGE_CACHE_SUBDIR / "reference_work" / f"{key}.json"


def work_cached(cache_dir: str, device: torch.device, problem_text: str | None) -> bool:
    """Whether the judge's cache holds this problem's `reference_work` (what `cached_reference_work` reads)."""
    path = work_cache_path(cache_dir, device, problem_text=problem_text)
    return path is not None and isinstance(jsoncache.read(path), dict)


def cached_reference_work(
    ref_model: torch.nn.Module,
    inputs: Any,
    problem_path: str | None,
    cache_dir: str,
    device: torch.device,
    problem_text: str | None = None,
) -> dict[str, Any]:
    """`reference_work`, cached per problem text, device type and torch version.

    FlopCounterMode's first use costs seconds (lazy imports); a run evaluates one problem many times.
    """
    path = work_cache_path(cache_dir, device, problem_path, problem_text)
    if path is not None:
        work = jsoncache.read(path)
        if isinstance(work, dict):
            work["cached"] = True
            return work
    work = reference_work(ref_model, inputs)
    if path is not None:
        jsoncache.write(path, work)
    work["cached"] = False
    return work


def collect(
    cfg: EvalConfig,
    device: torch.device,
    ref_model: torch.nn.Module,
    cand_model: torch.nn.Module,
    inputs: Any,
    candidate_ms: float | None,
    candidate_path: str | None,
    build_log: list[dict[str, Any]],
    modules: list[tuple[str, Any]],
    candidate_module: Any = None,
    problem_path: str | None = None,
) -> dict[str, Any]:
    """Metadata entries of the profile stage: gpu_facts, reference_work, roofline, profile."""
    out: dict[str, Any] = {}
    pc = cfg.profile
    facts = None
    try:
        facts = gpu_facts.collect(device, cfg.cache_dir, measure=pc.measure_peaks)
        out["gpu_facts"] = facts
    except Exception as exc:
        out["gpu_facts_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if pc.roofline:
        try:
            work = cached_reference_work(ref_model, inputs, problem_path, cfg.cache_dir, device)
            out["reference_work"] = work
            if facts is not None and candidate_ms:
                peak_flops, peak_bw, source = roofline.choose_peaks(facts, work["precision"])
                if peak_bw:
                    r = roofline.compute(
                        work["flops"], work["min_bytes"], candidate_ms, peak_bw, peak_flops, source, work["precision"]
                    )
                    out["roofline"] = r.to_dict()
                    out["roofline_line"] = roofline.line(r)
        except Exception as exc:
            out["roofline_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if pc.enabled:
        build_dirs = [b["dir"] for b in build_log if b.get("dir")]
        try:
            out["profile"] = torch_profile(
                cand_model,
                inputs,
                device,
                kernel_names.candidate_texts(candidate_path, build_dirs),
                build_dirs,
                modules,
                candidate_module,
            )
        except Exception as exc:
            out["profile_error"] = f"torch.profiler failed: {type(exc).__name__}: {str(exc)[:300]}"
    return out
