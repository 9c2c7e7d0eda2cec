"""The judge's clock against the candidates of tests/clock_attacks/, as figures: what the test suite
does not assert because load moves it. Run it on a quiet machine (nothing else running): the
honest control's speed-up band, each forgery's speed-up, the races that load decides, and on a
CUDA device the clock's own bands.

    python3 benchmarks/clock_checks.py [--device cpu|cuda|both] [--repeats 1] [--out FILE]

Prints one JSON line per check (the figures and `held`: whether the figure is inside what the
check asks) and exits 1 if any check did not hold. The test suite keeps what no load may make
happen: a verdict, a flag, never a forged speed-up the record trusts (tests/test_clock_attacks.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kernelwright.core.config import EvalConfig, StageTimeouts, TimingConfig  # noqa: E402
from kernelwright.core.record import EvalResult, Status  # noqa: E402
from kernelwright.engine import evaluate  # noqa: E402
from kernelwright.engine.config_resolution import resolve_config  # noqa: E402

TESTS = ROOT / "tests"
ATTACKS = TESTS / "clock_attacks"
SWISH = TESTS / "fixtures" / "problems" / "swish.py"
CUDA_EXAMPLE = ROOT / "examples" / "cuda_swish"
FORGED = 3.0  # a forged speed-up (8-265x before the judge held the clock); an honest one is about 1x
HONEST_BAND = (0.4, 2.5)  # the honest control on a 2-core machine, whose windows vary up to 2x
FORGERIES = ["replay_by_content.py", "rewrite_report.py", "swap_clock.py", "slow_reference.py", "hold_device.py"]


def _config(cache: str, device: str, sandbox: str = "none", windows: int = 3) -> EvalConfig:
    """The protocol's own timing in shorter windows, as the clock-attack tests run it."""
    timing = dataclasses.replace(TimingConfig(), windows=windows, window_ms=30.0, window_deadline_s=3.0)
    base = EvalConfig(
        device=device,
        sandbox=sandbox,
        trials=2,
        cache_dir=cache,
        timeouts=StageTimeouts(startup=120, build=600, init=60, correctness=60, timing=300, profile=60),
        timing=timing,
    )
    return resolve_config(base)


def _row(check: str, r: EvalResult, held: bool, **extra: Any) -> dict[str, Any]:
    return {
        "check": check,
        "held": held,
        "status": r.status.value,
        "speedup": r.speedup,
        "trusted": r.speedup_trusted if r.speedup is not None else None,
        "flags": sorted(r.metadata.get("guards", {}).get("flags", {})),
        **extra,
    }


def cpu_checks(cache: str) -> Iterator[dict[str, Any]]:
    sandboxes = ["none"] + (["bwrap"] if shutil.which("bwrap") else [])
    for sandbox in sandboxes:  # the protocol's five windows a side: the figure is a ratio of medians
        r = evaluate(SWISH, ATTACKS / "honest.py", _config(cache, "cpu", sandbox, TimingConfig().windows))
        lo, hi = HONEST_BAND
        held = r.status is Status.PASSED and r.speedup is not None and lo < r.speedup < hi
        # the runner's calls reuse the heap's pages: no timed window gives one output (1024 pages) fresh pages
        windows = r.metadata.get("timing", {}).get("windows", [])
        faults = [w["runner_says_ms"].get("faults") for w in windows]
        held = held and all(isinstance(f, int) and f < 1024 for f in faults)
        yield _row("cpu honest control about 1x", r, held, sandbox=sandbox, band=HONEST_BAND, faults=faults)
    sandbox = sandboxes[-1]
    for name in FORGERIES:
        r = evaluate(SWISH, ATTACKS / name, _config(cache, "cpu", sandbox))
        held = r.status is not Status.PASSED or (r.speedup is not None and r.speedup < FORGED)
        yield _row(f"cpu {name} gets no speed-up", r, held, sandbox=sandbox, below=FORGED)
    r = evaluate(SWISH, ATTACKS / "deferred_output.py", _config(cache, "cpu"))
    yield _row("cpu deferred_output.py fails on its timed outputs", r, r.status is Status.INCORRECT)
    for sandbox in sandboxes:
        r = evaluate(SWISH, ATTACKS / "inflate_measures.py", _config(cache, "cpu", sandbox))
        held = r.status is Status.PASSED and r.speedup is not None and r.speedup < 1.5
        yield _row("cpu work hidden in the commit counts", r, held, sandbox=sandbox, below=1.5)
    replay = TESTS / "verdict_attacks" / "replay_by_version.py"
    add_one = TESTS / "fixtures" / "problems" / "add_one.py"
    r = evaluate(add_one, replay, _config(cache, "cpu"))
    held = r.status is Status.PASSED and r.speedup is not None and r.speedup < 1.5
    yield _row("cpu outputs replayed by version gain nothing", r, held, below=1.5)


def cuda_checks(cache: str) -> Iterator[dict[str, Any]]:
    cfg = _config(cache, "cuda")
    # the device clock cannot tell the commit from the calls: what comes off for it is the judge's
    # own measure of one commit, so skipping it hides at most that much work
    honest, cheat = evaluate(SWISH, ATTACKS / "honest.py", cfg), evaluate(SWISH, ATTACKS / "skip_commit.py", cfg)
    held = honest.status is Status.PASSED and cheat.status is Status.PASSED
    if held:
        timing = cheat.metadata["timing"]
        commit = max(timing["device_clock"]["commit_ms"].values())
        gain_allowed = 1.5 * commit / timing["calls_per_window"]
        held = cheat.candidate_ms >= honest.candidate_ms - gain_allowed
    yield _row(
        "cuda a skipped commit gains at most the commit",
        cheat,
        held,
        cheat_ms=cheat.candidate_ms,
        honest_ms=honest.candidate_ms,
    )
    # what the judge took off against the honest runner's own events (trusted here: the reference's code)
    r = evaluate(SWISH, ATTACKS / "honest.py", _config(cache, "cuda", windows=5))
    held = r.status is Status.PASSED
    off_by: list[float] = []
    if held:
        timing = r.metadata["timing"]
        switch = timing["device_clock"]["switch_ms"]
        for w in timing["windows"]:
            d, says = w["device_ms"], w["runner_says_ms"]
            paid = d["runner"] - says["device"] - says["commit"]  # the two switches, as this window paid them
            off_by.append(switch - paid)
            held = held and 0.8 * paid - 0.02 <= switch <= 1.25 * paid + 0.02 and bool(d["judge_queued"])
            held = held and d["off"]["copy_in"] >= 0.97 * d["copy_in"]
        held = held and r.speedup is not None and 0.85 < r.speedup < 1.15
    yield _row("cuda what comes off is what the honest runner's windows pay", r, held, switch_minus_paid_ms=off_by)
    cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, compare_compile=True))
    r = evaluate(CUDA_EXAMPLE / "problem.py", CUDA_EXAMPLE / "candidate.py", cfg)
    held = r.status is Status.PASSED and r.speedup is not None and r.speedup > 1.0  # one pass instead of four
    yield _row("cuda the bundled candidate is faster than its reference", r, held)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every check")
    ap.add_argument("--out", type=Path, help="also write the lines here (JSON lines)")
    args = ap.parse_args()
    import torch

    runs: list[Callable[[str], Iterator[dict[str, Any]]]] = []
    if args.device in ("cpu", "both"):
        runs.append(cpu_checks)
    if args.device in ("cuda", "both"):
        if torch.cuda.is_available():
            runs.append(cuda_checks)
        elif args.device == "cuda":
            print("no CUDA device visible: run --device cpu here, or this on a GPU machine", file=sys.stderr)
            return 2
    failed = 0
    out = args.out.open("w") if args.out else None
    with tempfile.TemporaryDirectory(prefix="kw-clock-checks-") as cache:
        for _ in range(args.repeats):
            for checks in runs:
                for row in checks(cache):
                    line = json.dumps(row)
                    print(line, flush=True)
                    if out:
                        out.write(line + "\n")
                    failed += not row["held"]
    if out:
        out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
