"""How a candidate that makes its choices at its first call draws its speed, in plain processes and in
kernelwright under each of its mechanisms turned off: to find by measurement what moves the draw.

A candidate flagged `autotuned` (cuDNN's benchmark mode; often a layout it times itself at its first
call) runs one steady path a process, chosen at that process's first call; kernelwright's runner has
drawn the slower path more often than a plain process does (docs/PERFORMANCE.md). This finds which
of the engine's mechanisms, or which condition around the first call, moves the draw, one draw a
fresh process:

- `plain`: the candidate alone (benchmarks/timer_agreement.py `side`: its first call, then
  triton's `do_bench`);
- `pressure`, `busy`, `profiler`: a plain process of this file's whose first call has only 6 GB of
  the device left free, another process's matmuls beside it, or a profiler session opened before it
  (after the weights and inputs are on the device); then `do_bench`;
- `tools_first`: a plain process that opens a profiler session and makes the device hand-off's
  exportable allocation before anything of the problem is on the device: a spare runner's old
  start-up order (runner.py `warm_up` now leaves both to after the candidate's first call);
- `handoff_first`, `cublas_first`, `clock_first`, `judge_first`: the same for the reference's side
  (`--side reference`, the judge times the reference): the hand-off's self-test alone, cuBLAS's handles
  alone (a float32 and a float64 matmul), the device clock's self-test alone, or all three in the
  judge's order (judge.Judge.startup), made before the problem is on the device;
- `memops_first`, `region_first`: the device clock's self-test in parts: stream memory operations on a
  flag of the caching allocator's, or a driver-made region (cuMemCreate) zeroed and given back;
  `judge_first_released`: `judge_first`, then cuBLAS's workspaces and the allocator's cache given back;
- `shift_2mb` ... `shift_1gb`: that much device memory taken (and kept) before the model is built: whether
  a plain process's figure moves with where its memory lies; `shift_64mb_freed`: taken and given back
  (the allocator's cache emptied) first; `va_64mb`: only that much address space reserved (cuMemAddressReserve)
  and kept; `pa_64mb`: only that much physical memory made (cuMemCreate, never mapped) and kept;
  `baseline`: none of it (this file's own plain side, which records its addresses);
- `exp:<way>`: a way of SIDE_WAYS with the caching allocator's expandable segments on
  (PYTORCH_CUDA_ALLOC_CONF), which maps its own address range instead of calling cudaMalloc;
- `lent_inputs`: after the first call, `do_bench` on the inputs as they are (`ms_before`), then on a
  copy of them in a region laid out as a timing window lends them (`ms`);
- `fill`: a quiet first call, then calls whose outputs it keeps until the device has less than
  FILL_LEFT_GB free (as a timing window keeps its outputs), then `do_bench` again with them freed:
  whether memory taken after the first call alone moves the path (`ms_before`, `ms`);
- `kw:<variant>`: `kernelwright eval --json --no-server --no-profile`, with one of VARIANTS (a
  settings file and options that turn one mechanism off), the side's ms from the record.

`--side reference` draws the problem's `Model` instead of the candidate's `ModelNew`.

    python3 benchmarks/first_call_draws.py run CORPUS --keys level1/60_...,level1/77_... \\
        --draws 4 --ways plain,kw:default,kw:no_guards --out DIR
    python3 benchmarks/first_call_draws.py summary DIR

`run` appends a JSON line per draw to DIR/draws.jsonl (a later run adds to it); `summary` writes
DIR/draws.md: per pair and way, every draw's ms, their median, and how many draws are over 5% slower
than the median of the plain draws (a slow draw).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOW = 1.05  # a draw this much over the plain draws' median is a slow draw
FILL_LEFT_GB = 4.0  # `fill`: outputs kept until this much of the device is free

# each: (settings file text, extra `kernelwright eval` options); one mechanism off in each
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "default": ("", []),
    "no_sandbox": ("", ["--sandbox", "none"]),
    "no_guards": ("[eval.guards]\nenabled = false\n", []),
    "no_nan_fill": ("[eval.guards]\nnan_fill = false\n", []),
    "no_oracle": ("[eval.numerics]\noracle = false\n", []),
    "host_clock": ("[eval.timing]\ndevice_clock = false\nprobe = false\n", []),
    "no_handoff": ("[eval]\ndevice_handoff = false\n", []),
    "one_trial": ("", ["--trials", "1"]),
    "no_shapes": ("", ["--shapes", "off"]),
    # the windows' memory capped (default: 70% of what is free when they are planned): PyTorch's cuDNN
    # path runs its find again when a cached plan's workspace cannot be allocated, and keeps what fits
    "small_windows": ("[eval.timing]\nwindow_budget_mb = 4096\n", []),
}


SIDES = {"candidate": "ModelNew", "reference": "Model"}  # --side: the class drawn


def plain_draw(problem: Path, cand: Path, device: str, timeout: float, side: str = "candidate") -> dict:
    source = cand if side == "candidate" else problem
    cmd = [sys.executable, str(ROOT / "benchmarks" / "timer_agreement.py"), "side", SIDES[side]]
    cmd += [str(problem), str(source)]
    p = subprocess.run([*cmd, "--device", device], capture_output=True, text=True, timeout=timeout, cwd=cand.parent)
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    if not rows or "error" in rows[-1]:
        return {"error": (rows[-1].get("error") if rows else p.stderr.strip()[-300:]) or f"exit {p.returncode}"}
    row = rows[-1]
    ms = row.get("do_bench_ms", row.get("b2b_ms"))
    return {"ms": ms, "figures": row}


# the ways that run the candidate in a plain process of this file's own, under a condition
JUDGE_WAYS = ("handoff_first", "cublas_first", "clock_first", "judge_first")  # the judge's start-up, or a part
# the parts of the device clock's self-test, and the judge's start-up with what it cached given back
SPLIT_WAYS = ("memops_first", "region_first", "judge_first_released")
# MiB of the caching allocator's taken and kept first
SHIFT_WAYS = {"shift_2mb": 2, "shift_32mb": 32, "shift_64mb": 64, "shift_512mb": 512, "shift_1gb": 1024}
PLACE_WAYS = ("baseline", "shift_64mb_freed", "va_64mb", "pa_64mb")  # which of address or memory moves it
SIDE_WAYS = ("fill", "pressure", "busy", "profiler", "tools_first", *JUDGE_WAYS, *SPLIT_WAYS, *SHIFT_WAYS)
SIDE_WAYS += ("lent_inputs", *PLACE_WAYS)
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # `exp:<way>`
BUSY_S = 8.0  # `busy`: how long the other process multiplies matrices (from 3 s before the first call)


def plain_side(problem: Path, cand: Path, device: str, way: str, side: str = "candidate") -> dict:
    """In this process: the candidate built, then its first call under `way`'s condition, and
    `do_bench` (`ms`). `pressure`: only 6 GB of the device left free at the first call; `busy`:
    another process's matmuls beside it; `profiler`: a profiler session opened and closed before
    it; `tools_first`: a profiler session and an exportable allocation (device_handoff.probe) before
    the model is built; JUDGE_WAYS: the judge's start-up's device calls, or one part of them, before
    the model is built; `fill`: after a quiet first call (`ms_before`), outputs kept
    until less than FILL_LEFT_GB is free (at most 4096 calls), as a timing window keeps them, then
    freed and timed again. A GPU's only."""
    if not device.startswith("cuda"):
        return {"error": f"the {way} way needs a CUDA device (--device cuda)"}
    import torch
    import triton.testing

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from timer_agreement import SEED, _module

    dev = torch.device(device)
    if way == "tools_first":  # before anything of the problem is on the device
        sys.path.insert(0, str(ROOT / "src"))
        from torch.autograd.profiler import profile

        from kernelwright.engine.child import device_handoff

        with profile(use_device="cuda"):
            torch.ones(1, device=dev).add_(1)
            torch.cuda.synchronize()
        device_handoff.probe(dev)
    shift = None
    kept_driver: list = []  # va_64mb / pa_64mb: what the driver gave, kept until the side is timed
    if way in SHIFT_WAYS:  # the model's memory placed elsewhere, nothing else changed
        shift = torch.empty(SHIFT_WAYS[way] << 20, dtype=torch.uint8, device=dev)
    elif way == "shift_64mb_freed":
        torch.empty(64 << 20, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    elif way == "va_64mb":  # timer_agreement's placement of the same name
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from timer_agreement import hold

        kept_driver.append(int(hold(way, dev).facts["held_at"], 16))
    elif way == "pa_64mb":
        import ctypes

        sys.path.insert(0, str(ROOT / "src"))
        from kernelwright.engine.child import device_handoff as dh

        torch.ones(1, device=dev)  # the context made first, as in every other way
        d, idx = dh._driver(), dh._index(dev)
        handle = ctypes.c_ulonglong()
        size = dh._granular(64 << 20, idx)
        d.check(d.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(dh._prop(idx)), 0), "cuMemCreate")
        kept_driver.append(handle.value)
    elif way in SPLIT_WAYS:
        sys.path.insert(0, str(ROOT / "src"))
        from kernelwright.engine.child import shared_region
        from kernelwright.engine.child.timing import device_clock

        if way == "memops_first":  # stream memory operations on a flag of the caching allocator's
            flag = torch.zeros(64, dtype=torch.int32, device=dev)
            stream = torch.cuda.current_stream(dev)
            device_clock.memops().write(stream, flag.data_ptr(), 7)
            device_clock.memops().wait(stream, flag.data_ptr(), 7)
            torch.cuda.synchronize(dev)
            del flag
        elif way == "region_first":  # a driver-made (cuMemCreate) region, zeroed and given back; no memops
            region = shared_region.create(device_clock.FLAG_BYTES, dev)
            region.tensor.zero_()
            torch.cuda.synchronize(dev)
            region.close()
        else:  # judge_first, then cuBLAS's workspaces and the allocator's cache given back
            from kernelwright.engine.child import device_handoff

            for dtype in (torch.float32, torch.float64):
                x = torch.ones(8, 8, device=dev, dtype=dtype)
                (x @ x).sum().item()
            failed = device_handoff.self_test(dev) + device_clock.self_test(dev)
            if failed:
                return {"error": f"a self-test failed: {failed}"}
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
    elif way in JUDGE_WAYS:  # in the judge's order (judge.Judge.startup)
        sys.path.insert(0, str(ROOT / "src"))
        from kernelwright.engine.child import device_handoff
        from kernelwright.engine.child.timing import device_clock

        failed = ""
        if way in ("cublas_first", "judge_first"):
            for dtype in (torch.float32, torch.float64):
                x = torch.ones(8, 8, device=dev, dtype=dtype)
                (x @ x).sum().item()
        if way in ("handoff_first", "judge_first"):
            failed += device_handoff.self_test(dev)
        if way in ("clock_first", "judge_first"):
            failed += device_clock.self_test(dev)
        if failed:
            return {"error": f"a self-test failed: {failed}"}
    prob = _module(problem, "kw_draws_problem")
    mod = _module(cand, "kw_draws_candidate") if side == "candidate" else prob
    torch.manual_seed(SEED)
    init = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in prob.get_init_inputs()]
    model = getattr(mod, SIDES[side])(*init).to(dev)
    torch.manual_seed(SEED + 1)
    args = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in prob.get_inputs()]
    out: dict = {}
    hold, busy = None, None
    if way == "pressure":
        hold = torch.empty(max(0, torch.cuda.mem_get_info(dev)[0] - 6 * 2**30), dtype=torch.uint8, device=dev)
    elif way == "busy":
        loop = "import time, torch\na = torch.randn(8192, 8192, device='cuda')\nt = time.time()\n"
        loop += f"while time.time() - t < {BUSY_S}:\n    a @ a\n    torch.cuda.synchronize()\n"
        busy = subprocess.Popen([sys.executable, "-c", loop])
        time.sleep(3.0)
    elif way == "profiler":
        from torch.autograd.profiler import profile

        with profile(use_device="cuda"):
            torch.ones(1, device=dev).add_(1)
            torch.cuda.synchronize()

    def bench() -> float:
        return float(triton.testing.do_bench(lambda: model(*args), warmup=25, rep=100, return_mode="median"))

    region = None  # lent_inputs: kept until the side is timed

    with torch.no_grad():
        model(*args)  # the first call: the candidate's one-time choices
        torch.cuda.synchronize()
        if busy is not None:
            busy.wait()
        del hold  # the memory `pressure` held goes back before anything is timed
        torch.cuda.empty_cache()
        if way == "lent_inputs":  # after the first call: its inputs copied into a region as a window's are lent
            sys.path.insert(0, str(ROOT / "src"))
            from kernelwright.engine.child import shared_region
            from kernelwright.engine.child.timing.layouts import Layout

            out["ms_before"] = bench()
            layout = Layout.of_inputs(args)
            region = shared_region.create(layout.stride, dev)
            lent = list(args)
            for i, leaf in enumerate(layout.leaves):
                if leaf[0] == "tensor":
                    lent[i] = region.view(leaf[1], args[i].dtype, leaf[3])
                    lent[i].copy_(args[i])
            args = lent
            torch.cuda.synchronize(dev)
        if way == "fill":
            out["ms_before"] = bench()
            kept: list = []
            try:
                while torch.cuda.mem_get_info(dev)[0] > FILL_LEFT_GB * 2**30 and len(kept) < 4096:
                    kept.append(model(*args))
            except torch.OutOfMemoryError as exc:
                out["oom"] = str(exc)[:120]
            torch.cuda.synchronize()
            out["kept_calls"] = len(kept)
            kept.clear()
            torch.cuda.synchronize()
        out["ms"] = bench()
    # where the side's memory lay: each address's offset in its 2 MiB page (the first weight, the first input)
    tensors = [*list(model.parameters())[:1], *[a for a in args if isinstance(a, torch.Tensor)][:1]]
    out["offsets_2mib"] = [t.data_ptr() % (2 << 20) for t in tensors]
    out["ptrs"] = [hex(t.data_ptr()) for t in tensors]
    # every segment of the caching allocator's, in address order: where the driver placed the side's memory
    # (`cuda` names no index: the current device's; a segment's blocks are the side's weights, inputs,
    # outputs and its library's workspace)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    segs = sorted((s["address"], s["total_size"]) for s in torch.cuda.memory_snapshot() if s.get("device") == index)
    out["segments"] = [[hex(a), n >> 10] for a, n in segs]  # KiB
    if kept_driver:
        out["driver_kept"] = hex(kept_driver[0])
    if shift is not None:
        out["shift_mib"] = shift.numel() >> 20
    return out


def kw_draw(
    problem: Path, cand: Path, variant: str, device: str, timeout: float, work: Path, side: str = "candidate"
) -> dict:
    text, opts = VARIANTS[variant]
    cmd = [sys.executable, "-m", "kernelwright.cli.main", "eval", str(problem), str(cand), "--json"]
    cmd += ["--no-server", "--no-profile", "--device", device, *opts]
    if text:
        cfg = work / f"settings-{variant}.toml"  # in the caller's folder: a settings file in /tmp is passed over
        cfg.write_text(text)
        cmd += ["--config", str(cfg)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        rec = json.loads(p.stdout)
    except ValueError:
        return {"error": f"no record (exit {p.returncode}): {p.stderr.strip()[-300:]}"}
    if rec.get("status") != "passed":
        return {"error": f"{rec.get('status')}: {str(rec.get('error_log') or '')[:200]}"}
    flags = sorted(((rec.get("metadata") or {}).get("guards") or {}).get("flags") or {})
    other = "reference" if side == "candidate" else "candidate"
    return {"ms": rec.get(f"{side}_ms"), f"{other}_ms": rec.get(f"{other}_ms"), "flags": flags}


def _in_child(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    """One of this file's own sides in a fresh process (`env`: added to its environment): its last JSON line."""
    full = {**os.environ, **env} if env else None
    p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, timeout=timeout, env=full)
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return rows[-1] if rows else {"error": p.stderr.strip()[-300:] or f"exit {p.returncode}"}


def run(
    corpus: Path,
    keys: list[str],
    ways: list[str],
    draws: int,
    device: str,
    out: Path,
    timeout: float,
    side: str = "candidate",
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for way in ways:
        side_way = way.removeprefix("exp:")
        if way != "plain" and side_way not in SIDE_WAYS and way.removeprefix("kw:") not in VARIANTS:
            known = ", ".join(("plain", *SIDE_WAYS))
            raise SystemExit(f"unknown way {way!r}: {known}, or kw:<one of {', '.join(VARIANTS)}>")
    with (out / "draws.jsonl").open("a") as f:
        for key in keys:
            level, stem = key.split("/", 1)
            problem, cand = corpus / "problems" / level / f"{stem}.py", corpus / "candidates" / level / f"{stem}.py"
            if not (problem.exists() and cand.exists()):
                raise SystemExit(f"no pair {key} in {corpus} (problems/ and candidates/{level}/{stem}.py)")
            for i in range(draws):  # the ways interleaved, so a drift of the machine touches each alike
                for way in ways:
                    t0 = time.perf_counter()
                    try:
                        if way == "plain":
                            row = plain_draw(problem, cand, device, timeout, side)
                        elif way.removeprefix("exp:") in SIDE_WAYS:
                            argv = ["side", way.removeprefix("exp:"), str(problem), str(cand), "--device", device]
                            env = EXPANDABLE if way.startswith("exp:") else None
                            row = _in_child([*argv, "--side", side], timeout, env)
                        else:
                            row = kw_draw(problem, cand, way.removeprefix("kw:"), device, timeout, out, side)
                    except subprocess.TimeoutExpired:
                        row = {"error": f"timed out after {timeout:.0f} s"}
                    pair = key if side == "candidate" else f"{key} (reference)"
                    row.update(pair=pair, way=way, draw=i, wall_s=round(time.perf_counter() - t0, 1))
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"{pair} {way} #{i}: {row.get('ms') or row.get('error')}", flush=True)


def summary(out: Path) -> dict:
    rows = [json.loads(x) for x in (out / "draws.jsonl").read_text().splitlines() if x.strip()]
    table: dict[str, dict[str, list[float]]] = {}
    errors: dict[tuple[str, str], int] = {}
    for r in rows:
        if isinstance(r.get("ms"), (int, float)):
            table.setdefault(r["pair"], {}).setdefault(r["way"], []).append(float(r["ms"]))
        else:
            errors[(r["pair"], r["way"])] = errors.get((r["pair"], r["way"]), 0) + 1
    result: dict = {}
    lines = [
        "# First-call draws",
        "",
        f"A slow draw: over {SLOW:.2f}x the median of the pair's plain draws.",
        "",
        "| pair | way | draws (ms) | median | slow draws | failed |",
        "|---|---|---|---|---|---|",
    ]
    for pair, ways in sorted(table.items()):
        base = statistics.median(ways["plain"]) if ways.get("plain") else None
        for way, ms in sorted(ways.items(), key=lambda kv: (kv[0] != "plain", kv[0])):
            slow = sum(1 for m in ms if base is not None and m > SLOW * base)
            result.setdefault(pair, {})[way] = {"ms": ms, "median": statistics.median(ms), "slow": slow}
            cells = ", ".join(f"{m:.4g}" for m in ms)
            mark = "-" if base is None else f"{slow} of {len(ms)}"
            lines.append(
                f"| {pair} | {way} | {cells} | {statistics.median(ms):.4g} | {mark} | {errors.get((pair, way), 0)} |"
            )
    (out / "draws.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("corpus", type=Path)
    r.add_argument("--keys", required=True, help="pairs: level1/60_conv_standard_3D__...,level1/77_...")
    ways_help = f"plain, {', '.join(SIDE_WAYS)}, kw:<variant> ({', '.join(VARIANTS)})"
    r.add_argument("--ways", default="plain,kw:default", help=ways_help)
    r.add_argument("--draws", type=int, default=4)
    r.add_argument("--side", choices=SIDES, default="candidate", help="which class is drawn (default: candidate)")
    r.add_argument("--device", default="cuda")
    r.add_argument("--timeout", type=float, default=300.0)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    f = sub.add_parser("side", help="one draw in this process (a way of SIDE_WAYS)")
    f.add_argument("way", choices=SIDE_WAYS)
    f.add_argument("problem", type=Path)
    f.add_argument("cand", type=Path)
    f.add_argument("--device", default="cuda")
    f.add_argument("--side", choices=SIDES, default="candidate")
    args = ap.parse_args()
    if args.cmd == "side":
        try:
            row = plain_side(args.problem.resolve(), args.cand.resolve(), args.device, args.way, args.side)
        except Exception as exc:  # the draw's failure is its row
            row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(row), flush=True)
        return 0
    if args.cmd == "run":
        keys = [k for k in args.keys.split(",") if k]
        ways = [w for w in args.ways.split(",") if w]
        run(args.corpus.resolve(), keys, ways, args.draws, args.device, args.out.resolve(), args.timeout, args.side)
        summary(args.out)
    else:
        summary(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
