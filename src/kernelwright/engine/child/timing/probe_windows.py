"""The judge's windows on its probe (`probe.py`): the device clock's empty windows (the two
context switches, `switch_timer`) and, on the wall clock, a probe window after each of the
candidate's (its opening, `probe_timer`, `probe_window`). A probe that fails is dropped, never the
candidate's fault: what it would have measured then stays in the candidate's time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelwright.core.config import TimingConfig
from kernelwright.engine.child import shared_region
from kernelwright.engine.child.timing import device_clock, probe, stability
from kernelwright.engine.child.timing.layouts import Layout, WindowError
from kernelwright.engine.child.timing.window_plan import Measures
from kernelwright.engine.child.timing.window_timer import WindowTimer

PROBE_READY_S = 60.0
ANCHOR_PROBE_S = 20.0  # how long the judge waits at start-up for its probe, to measure the hand-over

# a probe window run while other processes kept this many cores busier than they did over the
# reference's window just before (the runner and the probe poll in both; other evaluations on the
# host load both alike), or three quarters of the cores busy, ran beside load from elsewhere: its
# opening is left out
PROBE_BUSY_CORES = 2.0


def _probe_process(device: torch.device, config: TimingConfig, wait_s: float = 0.0) -> tuple[Any, str]:
    """The judge's probe, ready (or None and why not): the process both clocks open windows on."""
    if not config.probe:
        return None, "timing.probe is off"
    p = probe.start(device)
    if p is None or not p.wait_ready(wait_s or PROBE_READY_S):
        return None, p.failed if p is not None else "no probe on this device"
    return p, ""


def measure_anchor(device: torch.device, config: TimingConfig, has_socket: bool) -> tuple[Any, str]:
    """The device clock's yardstick, taken before any candidate code has run (device_clock.Anchor):
    the two context switches of the probe's empty windows, the cap of what a window may take off
    for them. (None, why) where the device clock is off or the driver cannot order streams on a
    flag (the wall clock stands)."""
    if not (config.device_clock and has_socket):
        return None, "timing.device_clock is off" if has_socket else "no window socket"
    why = device_clock.self_test(device)
    if why:
        return None, why
    anchor = device_clock.Anchor()
    anchor.switch_ms = anchor.startup_ms = switch_ms(device, config)
    return anchor, ""


def switch_ms(device: torch.device, config: TimingConfig) -> float | None:
    """The least of five of the probe's empty windows (two context switches), or None where the
    probe or its windows failed."""
    cal = device_clock.Calibration(anchor=None)
    deadline = config.window_deadline_s
    pt, _ = switch_timer(device, config, cal, lambda s: deadline, windows_first=5, wait_s=ANCHOR_PROBE_S)
    if pt is not None:
        release_probe(pt)
    return cal.switch


def switch_timer(
    device: torch.device,
    config: TimingConfig,
    cal: Any,
    deadline: Callable[[float], float],
    windows_first: int = 3,
    wait_s: float = 0.0,
) -> tuple[WindowTimer | None, str]:
    """The probe's timer for the device clock's empty windows (the two context switches into
    `cal`), after `windows_first` of them; None and why where there is no probe or they failed
    (then nothing comes off for the switches)."""
    p, why = _probe_process(device, config, wait_s)
    if p is None:
        return None, f"device clock; no probe ({why}): the context switches stay in"
    # (empty windows call no model: at the judge's start-up there is no reference yet)
    pt = WindowTimer(p.sock, device, list, _no_model, lambda e, r, c, s: True, deadline)
    pt.clock = device_clock.Clock(device)
    for _ in range(windows_first):
        if switch_window(pt, cal) is None:
            pt.close()
            return None, "device clock; the probe's empty windows failed: the context switches stay in"
    return pt, "device clock"


def _no_model(*args: Any) -> None:
    return None


def switch_window(ptimer: WindowTimer, cal: Any) -> WindowTimer | None:
    """One empty window on the probe: its context switches into the calibration. A probe that
    fails is dropped (nothing more comes off for the switches), never the candidate's fault."""
    try:
        ms = ptimer.empty_window()
    except Exception as exc:  # (the probe's or the driver's: whatever it is, not the candidate's)
        probe.drop(ptimer.device, f"an empty window failed: {exc}")
        return None
    if ms is not None:
        cal.see_switch(ms)
        cal.see_armed(ptimer.clock.queued_ms)
    return ptimer


def probe_timer(
    device: torch.device,
    config: TimingConfig,
    timer: WindowTimer,
    draw: Callable[[], list[Any]],
    reference: Callable[..., Any],
    deadline: Callable[[float], float],
) -> tuple[WindowTimer | None, str]:
    """The probe's windows (sharing the runner's output ring), or None and why not."""
    p, why = _probe_process(device, config)
    if p is None:
        return None, f"the judge's own measures ({why})"
    pt = WindowTimer(p.sock, device, draw, reference, lambda e, r, c, s: True, deadline)
    pt.ring_owner = timer
    return pt, "probe"


def off(fixed: list[float] | None, before_ms: float) -> float:
    """What comes off a window for its opening: the smallest the probe measured at its size, over
    its windows that ran on a quiet machine (a process that slows the probe's windows can only
    make them larger; one that loads the cores while they run gets them left out), never more
    than half of the window's own time up to `computed` (as for the judge's own measure of it)."""
    return min(min(fixed), 0.5 * before_ms) if fixed else 0.0


def probe_window(
    ptimer: WindowTimer,
    sets: list[list[Any]],
    layout: Layout,
    ref_outs: list[Any],
    r_ms: float,
    fixed: dict[int, list[float]],
    seen: list[dict[str, Any]],
    busy_before: float | None,
) -> tuple[WindowTimer | None, str]:
    """One probe window on the candidate's sets: its cost besides the calls into `fixed`. A probe
    that fails is dropped (the later windows fall back to the judge's own measures), never the
    candidate's fault."""
    monitor = stability.CpuLoadMonitor()
    try:
        res = ptimer.candidate_window(sets, layout, ref_outs, expected_ms=2 * r_ms, measures=Measures(0.0, 0.0))
    except WindowError as exc:
        probe.drop(ptimer.device, f"a probe window failed: {exc}")
        return None, f"the judge's own measures after a probe window failed ({str(exc)[:120]})"
    busy = monitor.others_busy_cores()
    f = probe.fixed_ms(res.open_to_computed_ms, res.runner_ms)
    left_out = ""
    before = busy_before if busy_before is not None else 2.0
    if busy is not None and (busy > before + PROBE_BUSY_CORES or busy > 0.75 * stability.available_cores()):
        # other processes (the runner's: it should be idle now) loaded the machine while the probe
        # ran: its opening may be slower than a quiet one, which would take off too much
        left_out = f"{busy:.1f} cores busy beside the probe ({busy_before} over the reference's window)"
    elif f is not None:
        fixed.setdefault(res.calls, []).append(f)
    seen.append(
        {
            "calls": res.calls,
            "to_computed_ms": round(res.open_to_computed_ms, 4),
            "after_ms": round(res.after_ms, 4),
            "fixed_ms": None if f is None else round(f, 4),
            "left_out": left_out,
            "probe_says_ms": {str(k)[:20]: v for k, v in list(res.runner_ms.items())[:6] if isinstance(v, float)},
        }
    )
    return ptimer, ""


def release_probe(ptimer: WindowTimer) -> None:
    """The probe drops its mapping of the output ring (it lives on with the judge)."""
    try:
        shared_region.send(ptimer.sock, b'{"release": 1}', [])
    except OSError:
        pass
    ptimer.close()  # (the device clock's flags; the ring is the candidate timer's)
