"""What mapping a window's inputs costs a GPU window, and whether it can hide behind the calls.

One process, one GPU. The input sets (`--sets` of `--mb` MB, made and exported as the judge makes
a window's regions) lie in 1, 6, 12 or 48 regions; each is imported back from its descriptor and
mapped as a runner maps it, then a memory-bound kernel (F.silu, a fresh output per call) runs
once per set:

- `premapped`: the calls alone, on a mapping made before the clock (the device's own time);
- `K regions`: every region imported and mapped before the first call;
- `K regions, pipelined`: the first region before the first call, each other one just before
  its first set's call, while the device works on the earlier ones.

Wall time from before the first import to the calls' end (host clock, after a synchronisation),
the median of `--repeats`, with and without `--hold-gb` of other memory held by the caching
allocator. In one process only: a runner imports what another process exported, which costs
more per region (docs/PERFORMANCE.md).

    python3 benchmarks/window_mapping.py --sets 48 --mb 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from kernelwright.engine.child import shared_region


def _sync() -> None:
    torch.cuda.synchronize()


def run(chunks: list[shared_region.Region], per: int, n: int, numel: int, pipelined: bool) -> tuple[float, float]:
    """(wall ms of the window, of it the ms until the first call could start): the regions (each
    `per` sets) imported and mapped from their descriptors, all before the first call, or each
    one just before its first set's call (`pipelined`), then one call per set."""
    set_bytes = numel * 4
    keep: list[torch.Tensor] = []
    dev = torch.device("cuda")
    mapped: list[shared_region.Region] = []

    def attach(k: int) -> None:
        mapped.append(shared_region.attach(os.dup(chunks[k].fd), chunks[k].nbytes, dev))

    _sync()
    t0 = time.perf_counter()
    for k in range(1 if pipelined else len(chunks)):
        attach(k)
    t_open = time.perf_counter()
    with torch.no_grad():
        for i in range(n):
            k, j = divmod(i, per)
            if k >= len(mapped):
                attach(k)
            keep.append(F.silu(mapped[k].tensor[j * set_bytes : (j + 1) * set_bytes].view(torch.float32)))
    _sync()
    t1 = time.perf_counter()
    keep.clear()
    for m in mapped:
        m.close()
    return (t1 - t0) * 1e3, (t_open - t0) * 1e3


def premapped(region: shared_region.Region, n: int, numel: int) -> float:
    set_bytes = numel * 4
    keep: list[torch.Tensor] = []
    views = [region.tensor[i * set_bytes : (i + 1) * set_bytes].view(torch.float32) for i in range(n)]
    _sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        for v in views:
            keep.append(F.silu(v))
    _sync()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", type=int, default=48)
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--hold-gb", type=float, default=6.0)
    a = ap.parse_args()
    n, numel = a.sets, (a.mb << 20) // 4
    print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), f"{n} sets of {a.mb} MB")
    dev = torch.device("cuda")
    layouts: dict[int, list[shared_region.Region]] = {}
    for per in (n, 8, 4, 1):
        regs = [shared_region.create(min(per, n - k) * numel * 4, dev) for k in range(0, n, per)]
        for r in regs:
            r.tensor[: r.nbytes].view(torch.float32).normal_()
        layouts[per] = regs
    held: list[torch.Tensor] = []
    for hold in (0.0, a.hold_gb):
        while sum(t.numel() for t in held) < hold * (1 << 30):
            held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        rows: dict[str, list[tuple[float, float]]] = {}
        for _ in range(a.repeats):
            rows.setdefault("premapped", []).append((premapped(layouts[n][0], n, numel), 0.0))  # the maker's mapping
            for per, regs in layouts.items():
                for pipelined in (False, True) if per < n else (False,):
                    key = f"{len(regs)} regions" + (", pipelined" if pipelined else "")
                    rows.setdefault(key, []).append(run(regs, per, n, numel, pipelined))
        base = statistics.median(w for w, _ in rows["premapped"])
        for k, v in rows.items():
            wall = statistics.median(w for w, _ in v)
            opening = statistics.median(o for _, o in v)
            print(
                f"held {hold:4.1f} GB  {k:22s} wall {wall:8.3f} ms  ({wall / n:.4f} a call; over the calls alone "
                f"{wall - base:+.3f} ms)  until the first call {opening:.3f} ms  "
                f"[{min(w for w, _ in v):.3f}-{max(w for w, _ in v):.3f}]"
            )
    for regs in layouts.values():
        for r in regs:
            r.close()


if __name__ == "__main__":
    main()
