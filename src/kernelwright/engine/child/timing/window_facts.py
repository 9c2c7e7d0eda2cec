"""What the timing stage records about its clocks, beside the figures: the device clock's
calibration (`clock_facts`), why it was off (`clock_off`), and the calls as a caller launches them
one at a time (`launch_facts`, and `launch_gap` where a caller's timer would read another figure).
Evidence, never a verdict.
"""

from __future__ import annotations

import statistics
from typing import Any

from kernelwright.engine.child.timing.window_timer import WindowTimer


def launch_facts(rows: list[tuple[float, Any, float, Any]]) -> dict[str, Any]:
    """The calls as a caller launches them one at a time, beside the device's figures (evidence,
    not a verdict): per timed window (reference device ms, reference host ms, candidate device ms,
    candidate host ms), each a call; a call launched alone takes about the larger of its device
    time and its host's time to queue it. The candidate's host figure is the judge's wait for
    `armed` less its own measures of the rest (`device_clock.Calibration.launch_ms`). A host's time
    to queue the same calls varies from window to window far more than the device's, on both sides
    (docs/PERFORMANCE.md): each side's host figure is its quickest window's, where nothing but its
    own calls held it; the device figures are medians.
    Not compared with a threshold. ({} without windows that have both host figures.)"""
    if not rows:
        return {}
    med = statistics.median
    r_host, c_host = min(r[1] for r in rows), min(r[3] for r in rows)
    r_call, c_call = max(med(r[0] for r in rows), r_host), max(med(r[2] for r in rows), c_host)
    if c_call <= 0:
        return {}
    return {
        "reference_host_ms": round(r_host, 6),
        "candidate_host_ms": round(c_host, 6),
        "speedup_as_launched": round(r_call / c_call, 4),
        "windows": len(rows),
    }


def launch_gap(speedup: float | None, launch: dict[str, Any], device_ms: dict[str, float], limit: float) -> str:
    """The `launch_bound` line ("" where none, or `limit` is 0): the speed-up counts the device's
    work, and a caller's timer that waits for the host would read another figure. Either of two
    facts says so:
    - a side's host takes more than `limit` x its device time to launch one call (`device_ms`: each
      side's device time per call, the figures of the speed-up). A quick kernel behind Python
      (a few small launches) is then paced by the host, and timers that wait for it (`do_bench`,
      whose cache flush hides only part of it; back-to-back calls) read the host's pace. It compares
      each side's host with its own device, so it holds from run to run (docs/PERFORMANCE.md);
    - the speed-up as launched (`launch["speedup_as_launched"]`, each side's calls launched one at a
      time) differs from the device's by more than `limit` either way. The host's figures move from
      window to window far more than the device's, so this one alone flips between runs."""
    if not limit or not speedup or speedup <= 0 or not launch:
        return ""
    lines = []
    for side in ("reference", "candidate"):
        host, dev = launch.get(f"{side}_host_ms"), device_ms.get(side)
        if host and dev and dev > 0 and host > limit * dev:
            lines.append(
                f"the {side}'s host takes {host * 1e3:.3g} us to launch a call its device does in {dev * 1e3:.3g} us"
            )
    as_launched = launch.get("speedup_as_launched")
    if as_launched and as_launched > 0 and max(speedup / as_launched, as_launched / speedup) > limit:
        lines.append(f"as launched one call at a time, the host's launches included, it is {as_launched:.3g}x")
    if not lines:
        return ""
    return (
        f"the speed-up counts the device's work ({speedup:.3g}x); " + "; ".join(lines) + ": a timer that "
        "waits for the host (back-to-back calls, do_bench's calls behind its cache flush) reads nearer "
        "the host's pace"
    )


def clock_off(on_gpu: bool, device_clock_on: bool, why_off: str) -> str:
    """Why a stage ran on the wall clock."""
    if not on_gpu:
        return "a CPU evaluation: the judge's wall clock"
    if not device_clock_on:
        return "timing.device_clock is off"
    return why_off or "not measured at the judge's start-up"


def clock_facts(anchor: Any, timer: WindowTimer) -> dict[str, Any]:
    """The device clock's calibration as the stage ended."""
    cal = timer.cal
    return {
        "anchor": anchor.to_json() if anchor is not None else None,
        "contended": cal.contended(),
        "copy_in_ms": {str(k): round(v, 4) for k, v in cal.copy_in.items()},
        "snapshot_ms": {str(k): round(v, 4) for k, v in cal.snapshot.items()},
        "commit_ms": {f"{k[0]}/{k[1]}": round(v, 4) for k, v in cal.commit.items()},
        "switch_ms": None if cal.switch is None else round(cal.switch, 4),
        "switch_windows_ms": [round(x, 4) for x in cal.switches[:24]],
    }
