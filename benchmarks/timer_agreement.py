"""kernelwright's speed-ups against timers we did not write, on kernels we did not write.

For each (problem, candidate) pair of an outside corpus (CUDA-L1's release unpacked by
`benchmarks/corpus_suite.py unpack`: `problems/levelN/<stem>.py`, `candidates/levelN/<stem>.py`),
each side is timed alone, in a process of its own (the candidate's process never holds the
reference, so its process-wide settings touch nothing else), by four independent methods:

- `do_bench`: triton.testing.do_bench, the median of per-call CUDA events with L2 cleared before
  each call (what KernelBench's do_bench timing and most papers report: device time per call);
- `b2b`: 200 back-to-back calls cycling through 8 input sets, CUDA events around the whole loop
  (device time where the host keeps ahead, host time per call where it cannot);
- `events`: KernelBench's original per-call CUDA events with a synchronise after each call (mean);
- `cupti`: the device's own busy time per call, from the profiler's (CUPTI's) record of every kernel,
  copy and fill the calls ran: the union of their intervals over `CUPTI_CALLS` back-to-back calls.
  No host time and no per-call event in it: the device time kernelwright's clock claims to measure.
  It leaves out the device's idle gaps between one call's kernels, where a window includes them.

Then kernelwright's figures for the same pairs come from its records (`suite eval` and/or `eval`
alone), and `report` prints, per candidate, kernelwright's speed-up over each independent one, and
the distribution (geomean, median |ratio - 1|, share within 5% and 10%, those beyond 25% with the
flags the record carries).

    python3 benchmarks/timer_agreement.py independent corpus --levels 1,2 --limit 50 [--no-builds] --out DIR
    python3 benchmarks/timer_agreement.py kernelwright corpus --levels 1,2 --limit 50 --name NAME --out DIR [--alone]
    python3 benchmarks/timer_agreement.py report DIR [--name NAME ...]

`independent` and `kernelwright` write JSON lines into DIR (`independent.jsonl`,
`kw-<NAME>.jsonl`); `report` joins them (`agreement.md`, `agreement.json`); `floor --out DIR` adds
do_bench's own per-call floor on the GPU (`floor.json`), which the report then takes off as a diagnostic.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEED = 0
SETS = 8
B2B_CALLS = 200
# a slow side (a level-3 model at tens of ms a call) takes fewer calls: about this long of them, at
# least a tenth of the counts (200 back-to-back calls of a 50 ms model are 10 s of one side's time)
B2B_BUDGET_MS, EVENTS_BUDGET_MS = 1000.0, 500.0
CUPTI_CALLS, CUPTI_BUDGET_MS = 50, 500.0  # the profiled calls: at most this many, about this long of them
ROW = "kw-side-row "  # the side server's rows, told apart from anything else on its stdout


# ---------------------------------------------------------------- the corpus
def pairs(corpus: Path, levels: list[str], limit: int | None, no_builds: bool) -> list[tuple[str, Path, Path]]:
    """(stem, problem, candidate) in level and task order; `no_builds` leaves out candidates that
    compile an extension (their builds cost minutes of device time in every process)."""
    out = []
    for lv in levels:
        files = sorted((corpus / "candidates" / f"level{lv}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
        for cand in files:
            text = cand.read_text()
            if no_builds and ("load_inline" in text or "cpp_extension" in text):
                continue
            problem = corpus / "problems" / f"level{lv}" / cand.name
            if problem.exists():
                out.append((f"level{lv}/{cand.stem}", problem, cand))
    return out[:limit] if limit else out


# ---------------------------------------------------------------- one side, in its own process
def _module(path: Path, name: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- where a side's memory lies
# a placement: what is taken before anything of a side's (benchmarks/placement_spread.py): none, device memory
# through the caching allocator, or address space alone through the driver
PLACEMENTS = ("plain", "shift_2mb", "shift_64mb", "va_64mb")
SHIFT_MIB = {"shift_2mb": 2, "shift_64mb": 64}
VA_MIB = {"va_64mb": 64}


@dataclass
class Held:
    """What a placement took before the side was built, kept until the side's process ends."""

    kept: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)


def hold(placement: str, dev) -> Held:  # type: ignore[no-untyped-def]
    """Take `placement`'s hold on `dev` (a GPU's only): memory through the caching allocator, or
    address space alone through the driver. The CUDA context is made first in either case."""
    import torch

    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    if dev.type != "cuda":
        raise ValueError(f"the {placement} placement needs a CUDA device")
    torch.ones(1, device=dev)
    held = Held()
    if placement == "plain":
        return held
    if placement in SHIFT_MIB:
        t = torch.empty(SHIFT_MIB[placement] << 20, dtype=torch.uint8, device=dev)
        held.kept.append(t)
        held.facts["held_at"] = hex(t.data_ptr())
        return held
    import ctypes

    from kernelwright.engine.child import device_handoff as dh  # the driver's calls, as the engine makes them

    d = dh._driver()
    size = dh._granular(VA_MIB[placement] << 20, dh._index(dev))
    ptr = ctypes.c_ulonglong()
    d.check(d.lib.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "cuMemAddressReserve")
    held.kept.append(ptr.value)  # never freed: the process ends with the side
    held.facts["held_at"] = hex(ptr.value)
    return held


def time_side(
    problem: Path, source: Path, cls_name: str, device: str, build_only: bool = False, placement: str = ""
) -> dict:
    """One side's four figures (ms per call), each after its own warm-up; `build_only`: construct
    the model and make one call (its extension builds land in TORCH_EXTENSIONS_DIR), time nothing;
    `placement` (one of PLACEMENTS): device memory or address space taken before
    anything of the side's, kept while it is timed, and `do_bench` alone timed."""
    import torch

    prob = _module(problem, f"kw_agreement_problem_{abs(hash(problem))}")
    mod = prob if source == problem else _module(source, "kw_agreement_candidate")
    dev = torch.device(device)
    held = hold(placement, dev) if placement else None

    def to_dev(x):  # type: ignore[no-untyped-def]
        return x.to(dev) if isinstance(x, torch.Tensor) else x

    torch.manual_seed(SEED)
    init = [to_dev(x) for x in prob.get_init_inputs()]
    model = getattr(mod, cls_name)(*init).to(dev)
    sets = []
    for i in range(SETS):
        torch.manual_seed(SEED + 1 + i)
        sets.append([to_dev(x) for x in prob.get_inputs()])
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out: dict = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        model(*sets[0])
        sync()
        if build_only:
            return {"first_call_s": round(time.perf_counter() - t0, 2)}
        for i in range(3):
            model(*sets[i % SETS])
        sync()
        if dev.type == "cuda":
            import triton.testing

            out["do_bench_ms"] = float(
                triton.testing.do_bench(lambda: model(*sets[0]), warmup=25, rep=100, return_mode="median")
            )
            if held is not None:  # a placement's draw: do_bench alone
                return {**out, "placement": placement, **held.facts}
            each = max(out["do_bench_ms"], 1e-3)
            n_b2b = max(B2B_CALLS // 10, min(B2B_CALLS, round(B2B_BUDGET_MS / each)))
            n_ev = max(10, min(100, round(EVENTS_BUDGET_MS / each)))
            out["calls"] = {"b2b": n_b2b, "events": n_ev}
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            for i in range(min(20, n_b2b)):
                model(*sets[i % SETS])
            ev[0].record()
            for i in range(n_b2b):
                model(*sets[i % SETS])
            ev[1].record()
            sync()
            out["b2b_ms"] = ev[0].elapsed_time(ev[1]) / n_b2b
            times = []
            for i in range(n_ev):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                model(*sets[i % SETS])
                b.record()
                sync()
                times.append(a.elapsed_time(b))
            out["events_ms"] = statistics.fmean(times)
            try:
                out.update(profiled_busy(model, sets, max(5, min(CUPTI_CALLS, round(CUPTI_BUDGET_MS / each)))))
            except Exception as e:  # a profiler that cannot start: the side keeps its other three figures
                out["cupti_error"] = f"{type(e).__name__}: {e}"[:200]
        else:
            t0 = time.perf_counter()
            for i in range(B2B_CALLS // 10):
                model(*sets[i % SETS])
            out["b2b_ms"] = (time.perf_counter() - t0) * 1e3 / (B2B_CALLS // 10)
    return out


def profiled_busy(model, sets: list, calls: int) -> dict:  # type: ignore[no-untyped-def]
    """`cupti_ms`: the device's busy time per call over `calls` back-to-back calls (after the other
    methods' warm-ups), from the profiler's device activity (kernels, copies, fills), and how many
    device activities a call ran."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from kernelwright.suites.accounting import union_s  # kernels of several streams that overlap count once

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            model(*sets[i % SETS])
        torch.cuda.synchronize()
    spans = [
        [e.time_range.start, e.time_range.end]
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    if not spans:
        raise RuntimeError("the profiler recorded no device activity")
    return {"cupti_ms": union_s(spans) / 1e3 / calls, "cupti_activities": round(len(spans) / calls, 2)}


FLOOR_REPEATS = 20
TARED = "do_bench_tared"  # do_bench less its own per-call cost (`do_bench_floor`), where floor.json is present


def do_bench_floor(repeats: int = FLOOR_REPEATS) -> dict:
    """do_bench's own per-call cost on this GPU: its reading of a one-element add (the least work a call
    can launch), `repeats` times, beside the profiler's duration of that kernel. The difference (`tare_ms`:
    its events, the launch after its cache clear) taken as a constant of every call is the hypothesis
    the report's `do_bench_tared` tests; on an H200 it did not hold (docs/PERFORMANCE.md)."""
    import torch
    import triton.testing

    x = torch.zeros(1, device="cuda")

    def tiny(t):  # type: ignore[no-untyped-def]
        return t.add_(1.0)

    readings = [
        float(triton.testing.do_bench(lambda: tiny(x), warmup=25, rep=100, return_mode="median"))
        for _ in range(repeats)
    ]
    kernel_ms = profiled_busy(tiny, [[x]] * SETS, 50)["cupti_ms"]
    floor = statistics.median(readings)
    return {
        "device": torch.cuda.get_device_name(),
        "do_bench_floor_ms": floor,
        "floor_range_ms": [min(readings), max(readings)],
        "tiny_kernel_ms": kernel_ms,
        "tare_ms": max(0.0, floor - kernel_ms),
    }


def with_tared(ind: dict, floor: dict) -> None:
    """Adds `do_bench_tared_ms` (do_bench less `floor`'s tare, never below a hundredth of the reading)
    to each timed side of the independent rows `ind`."""
    tare = float(floor["tare_ms"])
    for row in ind.values():
        for side in ("reference", "candidate"):
            ms = row.get(side, {}).get("do_bench_ms")
            if ms:
                row[side][f"{TARED}_ms"] = max(ms - tare, ms / 100)


def _ext_dir(root: Path, source: Path) -> str:
    """One TORCH_EXTENSIONS_DIR per candidate: two candidates that name their extension alike never
    rebuild each other's, and the timing process finds the build its pre-build left."""
    return str(root / f"{source.parent.name}_{source.stem}")


def serve_sides() -> int:
    """Read jobs (JSON lines: cls, device, pairs, ext_dir, timeout, placement) from stdin; time each in a child
    forked from this process, which has imported torch but made no CUDA context (so the fork is
    safe): each side pays no interpreter or torch import, yet still runs in a process of its own
    (its process-wide settings die with it). One JSON line per pair on stdout."""
    import select
    import signal

    import torch

    assert not torch.cuda.is_initialized()
    for line in sys.stdin:
        job = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: time the job's pairs, write their rows, leave without cleanup
            os.close(r)
            os.dup2(2, 1)  # what a candidate prints goes to stderr, never into the rows
            os.environ["TORCH_EXTENSIONS_DIR"] = job["ext_dir"]
            os.chdir(str(Path(job["pairs"][0][1]).parent))
            with os.fdopen(w, "w") as f:
                for problem, source in job["pairs"]:
                    try:
                        row = time_side(
                            Path(problem),
                            Path(source),
                            job["cls"],
                            job["device"],
                            job.get("build_only", False),
                            job.get("placement", ""),
                        )
                    except BaseException as e:  # one side's failure is its row; the next pair still runs
                        row = {"error": f"{type(e).__name__}: {e}"[:300]}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
            os._exit(0)
        os.close(w)
        buf, deadline = b"", time.monotonic() + job["timeout"]
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
        os.close(r)
        timed_out = time.monotonic() >= deadline
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        rows = [json.loads(x) for x in buf.decode().splitlines() if x.startswith("{")]
        why = f"timed out after {job['timeout']:.0f} s" if timed_out else "the side's process died"
        rows += [{"error": why} for _ in range(len(job["pairs"]) - len(rows))]
        for row in rows:
            print(ROW + json.dumps(row), flush=True)
    return 0


class SideServer:
    """`serve_sides` in a process of its own, on one GPU (CUDA_VISIBLE_DEVICES)."""

    def __init__(self, gpu: str | None) -> None:
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve-sides"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def run(self, job: dict) -> list[dict]:
        assert self.proc.stdin and self.proc.stdout
        t0 = time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        rows: list[dict] = []
        while len(rows) < len(job["pairs"]):
            line = self.proc.stdout.readline()
            if not line:
                rows += [{"error": "the side server died"} for _ in range(len(job["pairs"]) - len(rows))]
            elif line.startswith(ROW):
                rows.append(json.loads(line[len(ROW) :]))
        wall = round(time.monotonic() - t0, 2)
        return [{**r, "process_s": wall} for r in rows]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def prebuild(
    chosen: list[tuple[str, Path, Path]], ext_root: Path, gpus: list[str | None], jobs: int, limit_s: float
) -> set[str]:
    """Construct each candidate that builds an extension and make one call, `jobs` at a time over
    the GPUs, so that its timing process finds the build done; returns the pairs whose pre-build
    failed or did not end within `limit_s` (they are not timed: their build would land in a timing)."""
    import concurrent.futures as cf

    todo = [c for c in chosen if any(k in c[2].read_text() for k in ("load_inline", "cpp_extension"))]
    deadline = time.monotonic() + limit_s
    bad: set[str] = set()

    def one(i: int, stem: str, problem: Path, cand: Path) -> None:
        left = deadline - time.monotonic()
        if left <= 5:
            bad.add(stem)
            return
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=_ext_dir(ext_root, cand), MAX_JOBS="4")
        gpu = gpus[i % len(gpus)]
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        cmd = [sys.executable, __file__, "side", "ModelNew", "--build-only", str(problem), str(cand)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env, cwd=str(cand.parent))
            ok = any(line.startswith("{") and "error" not in line for line in p.stdout.splitlines())
        except subprocess.TimeoutExpired:
            ok = False
        if not ok:
            bad.add(stem)

    with cf.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda a: one(*a), [(i, *c) for i, c in enumerate(todo)]))
    print(f"pre-built {len(todo) - len(bad)} of {len(todo)} candidates that build", flush=True)
    return bad


def independent(
    chosen: list[tuple[str, Path, Path]],
    out: Path,
    device: str,
    timeout: float,
    gpus: int,
    build_jobs: int,
    limit_s: float,
) -> None:
    """Pre-build the candidates that compile; then, on each GPU, its share of the pairs, pair by
    pair: the reference, then the candidate, each in a process forked from one that imported torch
    (a candidate's `__init__` may set cuDNN or TF32 flags: they die with it). Stops sending work at
    `limit_s` after the start; rows land in independent.jsonl as they come."""
    t0 = time.monotonic()
    ext_root = Path(os.environ.get("KW_EXT_ROOT", "/tmp/kw-agreement-ext"))
    devs: list[str | None] = [str(g) for g in range(gpus)] if gpus > 1 else [None]
    dest = out / "independent.jsonl"
    done = {json.loads(x)["pair"] for x in dest.read_text().splitlines()} if dest.exists() else set()
    chosen = [c for c in chosen if c[0] not in done]  # a later call goes on where an earlier one stopped
    skip = prebuild(chosen, ext_root, devs, build_jobs, limit_s * 0.45) if build_jobs else set()
    print(f"pre-builds done at {time.monotonic() - t0:.0f} s", flush=True)

    def row_of(server: SideServer, gpu: str | None, pair: tuple[str, Path, Path]) -> dict:
        stem, problem, cand = pair
        ref = server.run(side_job("Model", device, problem, problem, ext_root / "_references", timeout))[0]
        job = side_job("ModelNew", device, problem, cand, Path(_ext_dir(ext_root, cand)), timeout)
        return {"pair": stem, "gpu": gpu, "reference": ref, "candidate": server.run(job)[0]}

    over_gpus(devs, [c for c in chosen if c[0] not in skip], row_of, dest, t0 + limit_s)


def side_job(cls: str, device: str, problem: Path, source: Path, ext_dir: Path, timeout: float, **more: str) -> dict:
    """A side server's job: one side (`cls` of `source`, the problem's inputs) in a process of its own."""
    pair = [[str(problem), str(source)]]
    return {"cls": cls, "device": device, "pairs": pair, "ext_dir": str(ext_dir), "timeout": timeout, **more}


def over_gpus(
    devs: list[str | None],
    items: list,
    row_of: Callable[[SideServer, str | None, Any], dict],
    dest: Path,
    stop: float,
    group: Callable[[Any], Any] = lambda item: item,
) -> None:
    """Each GPU of `devs` its share of `items`, in turn, through a side server of its own:
    `row_of(server, gpu, item)` appended to `dest` as it comes. The items of one `group` go to one
    GPU (a side's draws are compared with each other, not with another GPU's), the groups dealt in
    turn. No item starts after `stop` (time.monotonic())."""
    import threading

    lock = threading.Lock()
    gpu_of = {k: i % len(devs) for i, k in enumerate(dict.fromkeys(map(group, items)))}

    def share(g: int) -> None:
        mine = [item for item in items if gpu_of[group(item)] == g]
        if not mine:
            return
        server = SideServer(devs[g])
        for item in mine:
            if time.monotonic() > stop:
                break
            row = row_of(server, devs[g], item)
            with lock, dest.open("a") as f:
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
        server.close()

    threads = [threading.Thread(target=share, args=(g,)) for g in range(len(devs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---------------------------------------------------------------- kernelwright's figures
def _kw_row(stem: str, rec: dict, how: str) -> dict:
    m = rec.get("metadata") or {}
    return {
        "pair": stem,
        "how": how,
        "path": rec.get("path"),
        "status": rec.get("status"),
        "speedup": rec.get("speedup"),
        "speedup_as_launched": rec.get("speedup_as_launched"),
        "candidate_ms": rec.get("candidate_ms"),
        "reference_ms": rec.get("reference_ms"),
        "flags": sorted(((m.get("guards") or {}).get("flags") or {}).keys()),
        "timing": m.get("timing"),
        "gpu_processes": m.get("gpu_processes"),  # who kept the GPU busy during the windows (NVML)
        "gpu_turn": m.get("gpu_turn"),
        "draws": m.get("draws"),  # --draws N: each draw's figures (engine/draws.py)
        "stage_times": rec.get("stage_times"),
    }


def kernelwright_alone(chosen: list[tuple[str, Path, Path]], out: Path, name: str, extra: list[str]) -> None:
    dest = out / f"kw-{name}.jsonl"
    with dest.open("a") as f:
        for stem, problem, cand in chosen:
            cmd = [sys.executable, "-m", "kernelwright.cli.main", "eval", str(problem), str(cand), "--json"]
            p = subprocess.run([*cmd, "--no-server", *extra], capture_output=True, text=True, timeout=600)
            try:
                rec = json.loads(p.stdout)
            except ValueError:
                rec = {"status": f"no record (exit {p.returncode}): {p.stderr.strip()[-200:]}"}
            f.write(json.dumps(_kw_row(stem, rec, "alone")) + "\n")
            f.flush()


def kernelwright_suite(
    corpus: Path, chosen: list[tuple[str, Path, Path]], out: Path, name: str, extra: list[str]
) -> None:
    """`suite eval` over the chosen pairs (benchmarks/corpus_suite.py's driver), then its records."""
    from benchmarks import corpus_suite

    levels = sorted({stem.split("/")[0].removeprefix("level") for stem, _, _ in chosen})
    keys = {key for key, _, _ in chosen}  # level2/1_task
    started = time.time()
    limit = float(os.environ.get("KW_SUITE_LIMIT", "0")) or None  # stopped as Ctrl-C stops it: records stay
    corpus_suite.run(corpus, levels, None, name, extra, limit, keys)
    dest = out / f"kw-{name}.jsonl"
    with dest.open("a") as f:
        for rec in corpus_suite._records(corpus / "runs" / name, since=started):
            parts = Path(rec["path"]).parts  # levelN/<stem>/<attempt>/eval.json
            f.write(json.dumps(_kw_row("/".join(parts[:2]), rec, "suite")) + "\n")


# ---------------------------------------------------------------- the comparison
def _independent_speedup(ind: dict, method: str) -> float | None:
    r, c = ind.get("reference", {}).get(f"{method}_ms"), ind.get("candidate", {}).get(f"{method}_ms")
    return r / c if r and c else None


def _ratio(kw: dict, ind: dict, method: str) -> float | None:
    """kernelwright's speed-up over the independent one (None where either is missing)."""
    independent = _independent_speedup(ind, method)
    if not (kw.get("speedup") and independent):
        return None
    return float(kw["speedup"]) / independent


def _dist(ratios: list[float]) -> dict:
    if not ratios:
        return {"n": 0}
    dev = sorted(abs(r - 1) for r in ratios)
    return {
        "n": len(ratios),
        "geomean": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3),
        "median_abs_dev": round(statistics.median(dev), 3),
        "within_5pct": sum(d <= 0.05 for d in dev),
        "within_10pct": sum(d <= 0.10 for d in dev),
        "beyond_25pct": sum(d > 0.25 for d in dev),
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


SMALL_MS = 0.1  # a reference under this (do_bench) is a small problem: its calls' launch costs show
INDEPENDENTS_AGREE = 0.10  # do_bench's and back-to-back's speed-ups this close: the pair's speed-up is not in doubt
AGREE = f"do_bench ~ b2b within {INDEPENDENTS_AGREE:.0%}"
UNFLAGGED = "no launch_bound in any run"  # the record says its timers would disagree where it is flagged
# the flags that say why a speed-up may differ from an independent timer's: the host paces the calls, the
# candidate's own algorithm choice (cuDNN's benchmark mode, or its own timing of its ways) moves from run to run,
# the timing itself was unsteady
EXPLAINS = frozenset({"launch_bound", "autotuned", "self_timed", "timing_unstable"})
# a speed-up the record trusts in every run (core/record.py: not withheld, the reference not degenerate): the
# figure a user reads and a reward takes; a constant output's 1e4x is no kernel's speed
TRUSTED = "trusted in every run"
# trusted, and the two timers of device time agree with each other: where they do not (a small problem whose
# kernels leave the device idle between them: do_bench counts the gaps, cupti's busy time does not), no one
# figure can lie within 10% of both
DEVICE_AGREE = f"trusted, do_bench ~ cupti within {INDEPENDENTS_AGREE:.0%}"
QUICKER_HALF = "all, the quicker half of each side's windows (diagnostic)"


def _recorded(kw: dict) -> float | None:
    """The record's speed-up."""
    return float(kw["speedup"]) if kw.get("speedup") else None


def _trusted(kw: dict) -> bool:
    """Does the record trust this run's speed-up (core/record.py, `speedup_trusted`)?"""
    from kernelwright.core.record import withheld_by

    return bool(kw.get("speedup")) and "degenerate_reference" not in kw["flags"] and not withheld_by(kw["flags"])


def _median_ratio(
    runs: dict, ind_row: dict, method: str, figure: Callable[[dict], float | None] = _recorded
) -> float | None:
    """The median over a candidate's runs of kernelwright's speed-up (`figure` of each run's record)
    over the independent one; None where either is missing."""
    independent = _independent_speedup(ind_row, method)
    sp = [x for k in runs.values() if (x := figure(k))]
    return statistics.median(sp) / independent if sp and independent else None


def quicker_half_speedup(kw: dict) -> float | None:
    """A diagnostic, not the record's rule: the speed-up from the mean of the quicker half of each
    side's windows, where the record takes each side's median. Another process's work on the GPU,
    time-sliced with some windows (a suite's other evaluations starting up beside the one timed),
    slows them; the median of five keeps it where three are hit. None without windows."""
    ws = [w for w in (kw.get("timing") or {}).get("windows") or [] if w.get("candidate_ms") and w.get("reference_ms")]
    if not ws:
        return None
    k = max(1, len(ws) // 2)
    ref = sorted(w["reference_ms"] for w in ws)[:k]
    cand = sorted(w["candidate_ms"] for w in ws)[:k]
    return statistics.fmean(ref) / statistics.fmean(cand)


def _pooled(per_pair: dict[str, dict], ind: dict, methods: list[str]) -> dict:
    """Each candidate passed in any run, once: the median of its runs' speed-ups over the
    independent one, for every candidate, the small problems and the rest, and the pairs whose two
    independent timers agree with each other (where they do not, neither is the pair's speed-up)."""
    out: dict = {}
    for method in methods:
        groups: dict[str, list[float]] = {
            "all": [],
            f"under {SMALL_MS} ms": [],
            f"{SMALL_MS} ms or more": [],
            AGREE: [],
            UNFLAGGED: [],
            TRUSTED: [],
            DEVICE_AGREE: [],
        }
        for pair, runs in per_pair.items():
            r = _median_ratio(runs, ind[pair], method)
            if r is None:
                continue
            ref = ind[pair].get("reference", {}).get("do_bench_ms") or 0.0
            groups["all"].append(r)
            groups[f"under {SMALL_MS} ms" if ref < SMALL_MS else f"{SMALL_MS} ms or more"].append(r)
            db, bb = _independent_speedup(ind[pair], "do_bench"), _independent_speedup(ind[pair], "b2b")
            if db and bb and abs(db / bb - 1) <= INDEPENDENTS_AGREE:
                groups[AGREE].append(r)
            if not any("launch_bound" in k["flags"] for k in runs.values()):
                groups[UNFLAGGED].append(r)
            if all(_trusted(k) for k in runs.values()):
                groups[TRUSTED].append(r)
                cu = _independent_speedup(ind[pair], "cupti")
                if db and cu and abs(db / cu - 1) <= INDEPENDENTS_AGREE:
                    groups[DEVICE_AGREE].append(r)
        for size, ratios in groups.items():
            out[f"{method}:{size}"] = _dist(ratios)
    quick = [
        r for pair, runs in per_pair.items() if (r := _median_ratio(runs, ind[pair], "do_bench", quicker_half_speedup))
    ]
    out[f"do_bench:{QUICKER_HALF}"] = _dist(quick)
    return out


def side_against_cupti(per_pair: dict[str, dict], ind: dict) -> dict:
    """Each side's time per call, kernelwright's over the profiler's busy time (`cupti_ms`): the same
    quantity, device time, if both are right, so it is compared as milliseconds, not as a speed-up.
    Per pair the median over its runs, split by the reference's do_bench time; above 1 where a window
    holds the device's idle gaps between a call's kernels (or time another context took), below 1
    never for a right clock beyond the two timers' noise."""
    out: dict = {}
    for side in ("reference", "candidate"):
        groups: dict[str, list[float]] = {"all": [], f"under {SMALL_MS} ms": [], f"{SMALL_MS} ms or more": []}
        for pair, runs in per_pair.items():
            cupti = ind[pair].get(side, {}).get("cupti_ms")
            ms = [float(x) for k in runs.values() if (x := k.get(f"{side}_ms"))]
            if not (cupti and ms):
                continue
            r = statistics.median(ms) / cupti
            ref = ind[pair].get("reference", {}).get("do_bench_ms") or 0.0
            groups["all"].append(r)
            groups[f"under {SMALL_MS} ms" if ref < SMALL_MS else f"{SMALL_MS} ms or more"].append(r)
        for size, ratios in groups.items():
            out[f"{side}:{size}"] = _dist(ratios)
    return out


SLOW_SIDE = 0.03  # a side kernelwright reads this much over both do_bench and cupti: worth a look


def slow_sides(per_pair: dict[str, dict], ind: dict, over: float = SLOW_SIDE) -> list[dict]:
    """The sides of pairs whose reference takes SMALL_MS or more that kernelwright reads more than
    `over` slower than both do_bench and cupti (its median over the runs): where its process, not the
    kernel, may set the pace (level1/77's candidate read 1.42 ms against 1.317 and 1.317 while a
    spare runner's start-up used the engine's device tools before the candidate's first call). Slowest first."""
    found = []
    for pair, runs in per_pair.items():
        if (ind[pair].get("reference", {}).get("do_bench_ms") or 0.0) < SMALL_MS:
            continue  # small problems: the timers measure different quantities there (launches, gaps)
        for side in ("reference", "candidate"):
            i = ind[pair].get(side, {})
            ms = [float(x) for k in runs.values() if (x := k.get(f"{side}_ms"))]
            db, cupti = i.get("do_bench_ms"), i.get("cupti_ms")
            if not (ms and db and cupti):
                continue
            kw = statistics.median(ms)
            if kw > (1 + over) * max(db, cupti):
                found.append(
                    {
                        "pair": pair,
                        "side": side,
                        "kw_ms": kw,
                        "do_bench_ms": db,
                        "cupti_ms": cupti,
                        "over": round(kw / max(db, cupti) - 1, 4),
                    }
                )
    return sorted(found, key=lambda r: -r["over"])


def _dist_table(labels: list[str], dists: dict[str, dict]) -> list[str]:
    """A markdown table of `_dist` results, one row a key (its parts split at ":" under `labels`), then a blank line."""
    cols = ["n", "geomean", "median abs dev", "within 5%", "within 10%", "beyond 25%", "range"]
    lines = ["| " + " | ".join(labels + cols) + " |", "|" + "---|" * (len(labels) + len(cols))]
    for key, d in dists.items():
        if d["n"]:
            cells = [*key.split(":"), d["n"], d["geomean"], d["median_abs_dev"], d["within_5pct"], d["within_10pct"]]
            cells += [d["beyond_25pct"], f"{d['range'][0]}-{d['range'][1]}"]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return [*lines, ""]


def report(out: Path, names: list[str]) -> dict:
    ind = {}
    for line in (out / "independent.jsonl").read_text().splitlines():
        row = json.loads(line)
        ind[row["pair"]] = row
    result: dict = {"runs": {}}
    lines = ["# Timer agreement", ""]
    methods = ["do_bench", "b2b", "events", "cupti"]
    if (out / "floor.json").exists():  # do_bench's own per-call cost on the GPU (`floor`): taken off too
        floor = json.loads((out / "floor.json").read_text())
        with_tared(ind, floor)
        methods.append(TARED)
        result["floor"] = floor
        lines += [
            f"do_bench's floor ({floor['device']}): {floor['do_bench_floor_ms'] * 1e3:.2f} us a call for a one-element"
            f" add ({floor['floor_range_ms'][0] * 1e3:.2f}-{floor['floor_range_ms'][1] * 1e3:.2f} us over"
            f" {FLOOR_REPEATS} readings), whose kernel the profiler times at {floor['tiny_kernel_ms'] * 1e3:.2f} us:"
            f" {TARED} takes {floor['tare_ms'] * 1e3:.2f} us off each side's do_bench figure.",
            "",
        ]
    per_pair: dict[str, dict] = {}
    for name in names:
        kw = [json.loads(x) for x in (out / f"kw-{name}.jsonl").read_text().splitlines()]
        passed = [k for k in kw if k["status"] == "passed" and k["pair"] in ind]
        dists = {}
        for method in methods:
            ratios = [r for k in passed if (r := _ratio(k, ind[k["pair"]], method))]
            dists[method] = _dist(ratios)
        result["runs"][name] = {"passed": len(passed), "of": len(kw), "against": dists}
        lines += [f"## {name}: {len(passed)} passed of {len(kw)}", ""]
        lines += _dist_table(["against"], dists)
        for k in passed:
            per_pair.setdefault(k["pair"], {})[name] = k
    pooled = _pooled(per_pair, ind, [m for m in methods if m != "events"])
    result["pooled"] = pooled
    lines += [
        "## Every candidate once (the median of its runs' speed-ups), by the reference's do_bench time, and"
        " where the two independent timers agree",
        "",
        *_dist_table(["against", "reference"], pooled),
    ]
    sides = side_against_cupti(per_pair, ind)
    if any(d["n"] for d in sides.values()):
        result["side_ms_over_cupti"] = sides
        lines += [
            "## Each side's time per call, kernelwright's ms over the profiler's device busy time (cupti)",
            "",
            *_dist_table(["side", "reference"], sides),
        ]
    slow = slow_sides(per_pair, ind)
    result["slow_sides"] = slow
    lines += [
        f"Sides kernelwright reads over {SLOW_SIDE:.0%} slower than both do_bench and cupti (references of"
        f" {SMALL_MS} ms or more): {len(slow)}"
        + "".join(
            f"\n- {r['pair']} {r['side']}: {r['kw_ms']:.4g} ms against {r['do_bench_ms']:.4g} and"
            f" {r['cupti_ms']:.4g} (+{r['over']:.1%})"
            for r in slow
        ),
        "",
    ]
    result["run_to_run"] = {}

    def not_autotuned(runs: dict) -> bool:
        return not any("autotuned" in r["flags"] for r in runs.values())

    def trusted(runs: dict) -> bool:  # a constant output's or a withheld speed-up's spread says nothing of the clock
        return all(_trusted(r) for r in runs.values())

    def unflagged(runs: dict) -> bool:  # a process's own draw of algorithms, or the host's pace
        return trusted(runs) and not any({"autotuned", "launch_bound"} & set(r["flags"]) for r in runs.values())

    for label, keep, figure in (
        ("all", lambda runs: True, _recorded),
        ("trusted in every run", trusted, _recorded),
        ("no autotuned flag", not_autotuned, _recorded),
        ("trusted, no autotuned or launch_bound flag", unflagged, _recorded),
        ("no autotuned flag, the quicker half (diagnostic)", not_autotuned, quicker_half_speedup),
    ):
        spreads = sorted(
            max(sp) / min(sp) - 1
            for runs in per_pair.values()
            if keep(runs) and len(sp := [x for r in runs.values() if (x := figure(r))]) >= 2
        )
        if spreads:  # the same candidate across the runs: max/min - 1 of its speed-ups
            p90 = spreads[min(len(spreads) - 1, math.ceil(0.9 * len(spreads)) - 1)]
            med = statistics.median(spreads)
            result["run_to_run"][label] = {"n": len(spreads), "median": round(med, 4), "p90": round(p90, 4)}
            lines += [
                f"Run to run, {label} ({len(spreads)} candidates passed in two runs or more; max/min - 1 of each "
                f"one's speed-ups): median {med:.1%}, p90 {p90:.1%}, largest {spreads[-1]:.1%}",
                "",
            ]
    # the bar: none beyond 25% of do_bench without a flag that says why
    unexplained = []
    for pair, runs in sorted(per_pair.items()):
        r = _median_ratio(runs, ind[pair], "do_bench")
        said = {f for k in runs.values() for f in k["flags"]} & EXPLAINS
        if r is not None and abs(r - 1) > 0.25 and not said:
            unexplained.append(pair)
    result["beyond_25pct_unexplained"] = unexplained
    lines += [
        f"Beyond 25% of do_bench with no flag that says why ({', '.join(sorted(EXPLAINS))} in any run): "
        f"{len(unexplained)}" + (f" ({', '.join(unexplained)})" if unexplained else ""),
        "",
    ]
    levels = sorted({p.split("/")[0] for p in per_pair})
    lines += [
        "Passed in any run, by level: "
        + ", ".join(f"{lv} {sum(p.startswith(lv + '/') for p in per_pair)}" for lv in levels),
        "",
    ]
    lines += [
        "## Per candidate (speed-ups; kernelwright per run, its first run's as launched and from the quicker half of"
        " its windows, then do_bench, b2b, cupti)",
        "",
    ]
    lines += [
        "| pair | ref ms (kw/do_bench/b2b/cupti) | cand ms (kw/do_bench/b2b/cupti) | kw | as launched | quicker half "
        "| do_bench | b2b | cupti | flags |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|---|"]
    for pair, runs in sorted(per_pair.items()):
        i = ind[pair]
        ir, ic = i.get("reference", {}), i.get("candidate", {})
        first = next(iter(runs.values()))
        sp = "/".join(f"{runs[n]['speedup']:.3f}" if n in runs else "-" for n in names)

        def f(x: float | None) -> str:
            return f"{x:.4g}" if x else "-"

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.3f}" if a and b else "-"

        lines.append(
            f"| {pair} | {f(first['reference_ms'])}/{f(ir.get('do_bench_ms'))}/{f(ir.get('b2b_ms'))}"
            f"/{f(ir.get('cupti_ms'))} | "
            f"{f(first['candidate_ms'])}/{f(ic.get('do_bench_ms'))}/{f(ic.get('b2b_ms'))}/{f(ic.get('cupti_ms'))} | "
            f"{sp} | {f(first.get('speedup_as_launched'))} | {f(quicker_half_speedup(first))} | "
            f"{ratio(ir.get('do_bench_ms'), ic.get('do_bench_ms'))} | {ratio(ir.get('b2b_ms'), ic.get('b2b_ms'))} | "
            f"{ratio(ir.get('cupti_ms'), ic.get('cupti_ms'))} | {','.join(first['flags'])} |"
        )
    (out / "agreement.md").write_text("\n".join(lines) + "\n")
    (out / "agreement.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return result


def _timed(path: Path) -> set[str]:
    """The pairs of an independent.jsonl with both sides timed."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {t["pair"] for t in rows if "error" not in t["reference"] and "error" not in t["candidate"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("side")
    s.add_argument("cls")
    s.add_argument("files", type=Path, nargs="+", help="PROBLEM SOURCE pairs")
    s.add_argument("--device", default="cuda")
    s.add_argument("--build-only", action="store_true")
    sub.add_parser("serve-sides")
    fl = sub.add_parser("floor", help="do_bench's own per-call cost on this GPU, into OUT/floor.json")
    fl.add_argument("--out", type=Path, required=True)
    for verb in ("independent", "kernelwright"):
        p = sub.add_parser(verb)
        p.add_argument("corpus", type=Path)
        p.add_argument("--levels", default="1,2")
        p.add_argument("--limit", type=int)
        p.add_argument("--no-builds", action="store_true")
        p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
        p.add_argument("--device", default="cuda")
        p.add_argument("--pairs-from", type=Path, help="only the pairs with both sides timed in this independent.jsonl")
        p.add_argument(
            "--passed-in", type=Path, action="append", default=[], help="only the pairs passed in this kw-NAME.jsonl"
        )
        p.add_argument("--keys", default="", help="only these pairs (level1/46_task,...)")
        if verb == "independent":
            p.add_argument("--timeout", type=float, default=180.0)
            p.add_argument(
                "--gpus", type=int, default=1, help="split the pairs over this many GPUs, one side at a time on each"
            )
            p.add_argument(
                "--build-jobs", type=int, default=0, help="pre-build candidates that compile, this many at a time"
            )
            p.add_argument("--limit-s", type=float, default=1e9, help="stop sending work this long after the start")
        else:
            p.add_argument("--name", default="suite")
            p.add_argument("--alone", action="store_true", help="`kernelwright eval` per pair, not `suite eval`")
            p.add_argument("--only-timed", action="store_true", help="only pairs with both sides in independent.jsonl")
    r = sub.add_parser("report")
    r.add_argument("out", type=Path)
    r.add_argument("--name", action="append", default=[])
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.cmd == "side":
        for problem, source in zip(args.files[::2], args.files[1::2], strict=True):
            try:
                row = time_side(problem.resolve(), source.resolve(), args.cls, args.device, args.build_only)
            except Exception as e:  # one side's failure is its row; the next pair still runs
                row = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(json.dumps(row), flush=True)
        return 0
    if args.cmd == "serve-sides":
        return serve_sides()
    if args.cmd == "floor":
        args.out.mkdir(parents=True, exist_ok=True)
        floor = do_bench_floor()
        (args.out / "floor.json").write_text(json.dumps(floor, indent=1))
        print(json.dumps(floor))
        return 0
    if args.cmd == "report":
        report(args.out, args.name or ["suite"])
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    levels = [v for v in args.levels.split(",") if v]
    chosen = pairs(args.corpus.resolve(), levels, args.limit, args.no_builds)
    if args.cmd == "kernelwright" and args.only_timed:  # the pairs whose sides both have independent figures
        chosen = [c for c in chosen if c[0] in _timed(args.out / "independent.jsonl")]
    if args.pairs_from:
        chosen = [c for c in chosen if c[0] in _timed(args.pairs_from)]
    if args.keys:
        chosen = [c for c in chosen if c[0] in set(args.keys.split(","))]
    if args.passed_in:  # kernelwright ran first: time independently only what it passed
        rows = [json.loads(x) for f in args.passed_in for x in f.read_text().splitlines()]
        passed = {k["pair"] for k in rows if k["status"] == "passed"}
        chosen = [c for c in chosen if c[0] in passed]
    print(f"{len(chosen)} pairs", flush=True)
    if args.cmd == "independent":
        independent(chosen, args.out, args.device, args.timeout, args.gpus, args.build_jobs, args.limit_s)
    elif args.alone:
        kernelwright_alone(chosen, args.out, args.name, ["--device", args.device, *extra])
    else:
        kernelwright_suite(args.corpus.resolve(), chosen, args.out, args.name, ["--device", args.device, *extra])
    return 0


if __name__ == "__main__":
    sys.exit(main())
