"""What each way of timing a GPU model measures, for one problem and candidate, in one process.

The old clock (per-call CUDA events, an L2 flush before each call) and the judge's device clock
(a window of calls on fresh inputs, back to back) disagree on launch-bound problems. This takes
them apart on our own examples (trusted code, run in this process, never a Coder's): for the
reference and the candidate, per call in ms,

- `events_flush`: the old clock: flush, event, call, event (the flush's device time gives the
  host a head start of its length);
- `events`: the same without the flush;
- `window`: N calls on N fresh input sets back to back, timed by events around them, started
  while the host enqueues (host gaps count: the device clock's window as the runner runs it);
- `window_ahead`: the same window enqueued entirely behind a device-side sleep before the first
  event (device time only: no host gap counts);
- `window_ahead_cold`: that, with an L2 flush after the inputs are written;
- `host`: the host's time to enqueue one call.

    python3 benchmarks/clock_anatomy.py examples/mamba2_ssd/problem_state.py examples/mamba2_ssd/candidate_state.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from typing import Any

import torch


def _load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _to(x: Any, dev: torch.device) -> Any:
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("candidate")
    ap.add_argument("--calls", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dev = torch.device("cuda")
    prob = _load(a.problem, "kw_problem")
    cand = _load(a.candidate, "kw_candidate")
    torch.manual_seed(0)
    init = [_to(x, dev) for x in prob.get_init_inputs()]
    ref = prob.Model(*init).to(dev).eval()
    torch.manual_seed(0)
    new = cand.ModelNew(*init).to(dev).eval()
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 * 2**20)
    flush_buf = torch.empty(max(2 * l2, 64 * 2**20), dtype=torch.int8, device=dev)
    sets = [[_to(x, dev) for x in prob.get_inputs()] for _ in range(a.calls)]
    one = sets[0]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "calls": a.calls}
    with torch.no_grad():
        for name, model in (("reference", ref), ("candidate", new)):
            for _ in range(5):
                model(*one)
            torch.cuda.synchronize()
            row: dict[str, float] = {}
            for flush in (True, False):
                s = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps)]
                e = [torch.cuda.Event(enable_timing=True) for _ in range(a.reps)]
                for i in range(a.reps):
                    if flush:
                        flush_buf.zero_()
                    s[i].record()
                    model(*one)
                    e[i].record()
                torch.cuda.synchronize()
                key = "events_flush" if flush else "events"
                row[key] = statistics.median(x.elapsed_time(y) for x, y in zip(s, e, strict=True))
            t0 = time.perf_counter()
            for _ in range(a.reps):
                model(*one)
            row["host"] = (time.perf_counter() - t0) * 1e3 / a.reps
            torch.cuda.synchronize()
            for mode in ("window", "window_ahead", "window_ahead_cold"):
                spans = []
                for _ in range(3):
                    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                    torch.cuda.synchronize()
                    if mode != "window":
                        if mode == "window_ahead_cold":
                            flush_buf.zero_()
                        torch.cuda._sleep(int(max(2.0, 3 * row["host"] * a.calls) * 2e6))
                    ev[0].record()
                    outs = [model(*s_) for s_ in sets]
                    ev[1].record()
                    torch.cuda.synchronize()
                    spans.append(ev[0].elapsed_time(ev[1]) / a.calls)
                    del outs
                row[mode] = min(spans)
            result[name] = {k: round(v, 5) for k, v in row.items()}
    for k in ("events_flush", "events", "window", "window_ahead", "window_ahead_cold"):
        result.setdefault("speedup", {})[k] = round(result["reference"][k] / result["candidate"][k], 3)
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(dict(result, problem=a.problem)) + "\n")


if __name__ == "__main__":
    main()
