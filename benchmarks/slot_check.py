"""The judge's check of a window's timed outputs (`correctness.slot_errors`): every slot against the
reference's output for its own inputs, stacked in float64 or one slot at a time in the leaf's own
precision (`errors`), on the CPU and, where there is one, a CUDA device.

    python3 benchmarks/slot_check.py [--slots 30] [--elements 1048576] [--repeats 5]

Prints one JSON line per device and way (best of the repeats, ms per window and per slot).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from kernelwright.engine.child import correctness


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()  # a first pass: the allocator's pages
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=30)
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    g = torch.Generator().manual_seed(0)
    for device in devices:
        refs = [torch.randn(args.elements, generator=g).to(device) for _ in range(args.slots)]
        cands = [r + 1e-6 * torch.randn(args.elements, generator=g).to(device) for r in refs]
        for stacked in (True, False):
            ms = _best(
                lambda c=cands, r=refs, s=stacked: correctness.slot_errors(c, r, stacked=s), device, args.repeats
            )
            row = {
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "threads": torch.get_num_threads(),
                "way": "stacked, float64" if stacked else "one by one, own precision",
                "slots": args.slots,
                "elements": args.elements,
                "ms": round(ms, 2),
                "ms_per_slot": round(ms / args.slots, 3),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
