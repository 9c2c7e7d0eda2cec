"""The judge's timing stage: windows on its own clock, their checks, and the physics cross-check.

`run(judge)` plans the windows from the reference's own time and the memory at hand, runs one
warm-up pair and then `timing.windows` pairs (reference window, then candidate window, each on a
fresh draw from the judge's secret stream), and writes the record's timing fields. Nothing the
runner reports about time enters: the candidate's figure is the judge's wall clock around the
window (`windows.py`), and every timed output is compared with the reference's output for the
same inputs. A candidate time under the roofline floor (`faster_than_hardware`) marks the
speed-up untrusted: an impossible time means a forged timer or skipped work.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kernelwright.core.record import Stage, Status, TimingStats
from kernelwright.engine.child import windows
from kernelwright.engine.child.compare import tensor_bytes

if TYPE_CHECKING:
    from kernelwright.engine.child.judge import Judge

TIMING_SEED_OFFSET = 10**9  # the timing draws' seeds are not the checks' seeds


def _budget_bytes(judge: Judge) -> int:
    mb = judge.cfg.timing.window_budget_mb
    if mb > 0:
        return mb << 20
    if judge.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(judge.device)
        # windows of a memory-bound problem are as long as this allows: each hand-over's fixed cost
        # is shared by more calls (the plan counts the runner's outputs too; a window that finds the
        # memory taken meanwhile, by other evaluations on the device, is halved and run again)
        return int(free * 0.7)
    return 1 << 30


def _out_of_memory(exc: BaseException) -> bool:
    """A device or host allocation refused (torch's, or the driver's for a window's region)."""
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "OUT_OF_MEMORY" in text or "out of memory" in text


def _phase(phases: dict[str, float], name: str, t0: float) -> float:
    now = time.perf_counter()
    phases[name] = round(phases.get(name, 0.0) + now - t0, 4)
    return now


def _resolution(ref: Any) -> float:
    """The coarsest relative resolution among the reference's floating outputs (eps of its dtype)."""
    from kernelwright.engine.child.compare import flatten

    eps = [torch.finfo(t.dtype).eps for _, t in flatten(ref) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return max(eps, default=0.0)


def _stats(samples: list[float], warmup: int) -> TimingStats:
    from kernelwright.engine.child.timing import stats_of

    return stats_of(samples, warmup, clock="judge_window", flush=False)


def run(judge: Judge) -> None:
    cfg, device = judge.cfg, judge.device
    judge.warmed()  # no import of the judge's runs beside its windows
    sock = judge.handoff
    if sock is None:
        judge.set_verdict(
            Status.ENGINE_ERROR,
            "The judge has no socket to the runner: timing windows cannot run "
            "(an engine bug, not the candidate's fault)",
            Stage.TIMING,
        )
        return
    counter = [0]

    def draw() -> list[Any]:
        counter[0] += 1
        inputs = judge.io.inputs(judge.secret + TIMING_SEED_OFFSET + counter[0])
        return list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]

    # a timed output must stray from the reference no further than the candidate's correct trials
    # did (with room), or than the output dtype's resolution: a replayed, skipped or unfinished
    # output strays by the size of the output itself
    norm_seen, elem_seen = judge.worst_errors

    def check(e: tuple[float, float] | None, ref: Any) -> bool:
        """A slot's errors (windows.errors: None where structure or non-finite pattern differ) -> acceptable."""
        if e is None:
            return False
        floor = max(cfg.rtol, _resolution(ref))
        return e[0] <= max(16 * norm_seen, floor) and e[1] <= max(16 * elem_seen, 4 * floor)

    def deadline(expected_s: float) -> float:
        return max(cfg.timing.window_deadline_s, 100.0 * expected_s)

    from kernelwright.engine.child import stability

    on_gpu = device.type == "cuda"
    cores = stability.available_cores()
    threads = stability.resolve_threads(cfg.timing, cores)
    prev_threads = torch.get_num_threads()
    if not on_gpu:  # one fixed thread count for both sides, recorded (the runner is told it too)
        torch.set_num_threads(threads)
    try:
        _run(judge, sock, draw, check, deadline, on_gpu, cores, threads)
    finally:
        torch.set_num_threads(prev_threads)


def _run(
    judge: Judge,
    sock: socket.socket,
    draw: Callable[[], list[Any]],
    check: Callable[[Any, Any], bool],
    deadline: Callable[[float], float],
    on_gpu: bool,
    cores: int,
    threads: int,
) -> None:
    import os
    import statistics

    from kernelwright.engine.child import stability
    from kernelwright.engine.child.problem_io import sync, trial_seed

    cfg, device, rec = judge.cfg, judge.device, judge.rec
    timer = windows.WindowTimer(
        sock, device, draw, judge.ref_model, check, deadline, threads=None if on_gpu else threads
    )
    # the reference's time per call, from the trials' inputs, sets the window's size
    _, _, inputs0 = judge.reference(trial_seed(judge.secret, 0))
    from kernelwright.engine.child.trees import clone

    with torch.no_grad():
        judge.ref_model(*clone(inputs0))
        sync(device)
        t0 = time.perf_counter()
        for _ in range(3):
            judge.ref_model(*clone(inputs0))
        sync(device)
    est_ms = (time.perf_counter() - t0) * 1e3 / 3
    ref0 = judge.reference(trial_seed(judge.secret, 0))[0]
    plan = windows.plan(
        est_ms,
        tensor_bytes(inputs0),
        tensor_bytes(ref0),
        _budget_bytes(judge),
        cfg.timing.window_ms,
        cfg.timing.windows,
        cfg.timing.max_window_calls,
    )
    compiled = None
    if cfg.timing.compare_compile:
        try:
            compiled = torch.compile(judge.ref_model)
            with torch.no_grad():
                compiled(*clone(inputs0))
        except Exception as exc:
            rec.metadata["compile_reference_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            compiled = None
    ref_ms: list[float] = []
    cand_ms: list[float] = []
    phases: dict[str, float] = {}  # the judge's own time in the timing stage, by phase
    busy: list[float] = []  # cores other processes kept busy while the reference was timed (the runner idles then)
    runnable: list[float] = []
    seen: list[windows.Measures] = []  # the judge's per-call measures of the windows' own costs
    comp_ms: list[float] = []
    details: list[dict[str, Any]] = []
    bad = checked = 0
    # on a GPU the judge's stream spans the runner's work (device_clock.py), where the driver can;
    # else a trusted probe process measures what a window costs besides the calls (probe.py)
    clocked = on_gpu and judge.anchor is not None and cfg.timing.device_clock
    clock_phases: list[Any] = []  # the timed windows' device_clock.Phases, in order (device clock)
    ref_host: list[float | None] = []  # the host's time to queue a reference call, by timed window (device clock)
    if clocked:
        from kernelwright.engine.child import device_clock

        timer.clock = device_clock.Clock(device)
        timer.cal = device_clock.Calibration(anchor=judge.anchor)
        ptimer, fixed_by = switch_timer(judge, timer.cal, deadline)
    else:
        ptimer, fixed_by = _probe_timer(judge, timer, draw, deadline) if on_gpu else (None, "")
    fixed: dict[int, list[float]] = {}  # sets per window -> the probe windows' openings (ms)
    # timed windows the probe's opening comes off: (index, calls, their time so far, their opening's ms)
    by_probe: list[tuple[int, int, float, float]] = []
    probe_seen: list[dict[str, Any]] = []  # the probe's windows, as evidence
    try:
        # one warm-up window; another when it grows the windows. On a GPU a grown warm-up window
        # is looked at once more: the first one's per-call time carries its fixed costs over few
        # calls (and the first calls' own), so it sizes the windows short, by an amount that varies
        # from run to run, and a launch-bound candidate's figure with it (docs/PERFORMANCE.md)
        warmups = 1
        r = shrunk = 0
        while r < plan.rounds + warmups:
            warm = r < warmups
            t_phase = time.perf_counter()
            try:
                sets, layout = timer.pool(plan.warmup_calls if warm else plan.calls)
                t_phase = _phase(phases, "draws", t_phase)
                # the load other processes make is read over the reference's window and the judge's
                # measures of the window's own costs, taken right after it (the runner waits then)
                monitor = stability.CpuLoadMonitor()
                r_ms, ref_outs = timer.reference_window(sets, layout)
                ref_host_now = timer.ref_host_ms if clocked and timer.ref_queued and not timer.as_launched else None
                monitor.tick()
                # (the probe's window after the candidate's measures the opening)
                probed = ptimer is not None and not clocked
                if clocked:
                    measured = windows.Measures(0.0, 0.0)  # (the device clock calibrates itself)
                else:
                    measured = timer.measures(sets, layout, ref_outs, opening=not probed)
                    seen.append(measured.per_call(len(sets)))
                load_seen = monitor.others_busy_cores(), monitor.others_runnable()
                t_phase = _phase(phases, "reference_windows", t_phase)
                res = timer.candidate_window(
                    sets,
                    layout,
                    ref_outs,
                    # (a warm-up window's deadline from the smaller of the two: the first reference
                    # window pays one-time page faults, and the warm-up is as large as the others)
                    expected_ms=2.0 * min(r_ms, est_ms) if warm else r_ms,
                    measures=measured,
                    ceiling=windows.ceiling(seen),
                )
                if clocked and ptimer is not None:
                    ptimer = _switch_window(ptimer, timer.cal)
                elif ptimer is not None:
                    ptimer, why = _probe_window(ptimer, sets, layout, ref_outs, r_ms, fixed, probe_seen, load_seen[0])
                    fixed_by = why or fixed_by
                timed_total = res.per_call_ms * res.calls
                if probed:
                    f = _off(fixed.get(res.calls), res.open_to_computed_ms)
                    res.per_call_ms = max(timed_total - f, 0.0) / res.calls
            except Exception as exc:  # memory other evaluations took since the plan: smaller windows
                # (the judge's own allocations only: a candidate that failed in its window, out of
                # memory or not, is the runner's error and ended the runner)
                if isinstance(exc, windows.WindowError) or not _out_of_memory(exc) or plan.calls <= 1 or shrunk >= 6:
                    raise
                shrunk += 1
                sets = ref_outs = []
                timer.close()  # a smaller ring for the smaller windows
                if on_gpu:
                    torch.cuda.empty_cache()
                plan.calls = plan.limit = max(1, plan.calls // 2)
                plan.warmup_calls = min(plan.warmup_calls, plan.calls)
                plan.reasons.append(f"{plan.calls} sets per window (out of device memory with twice as many)")
                continue
            r += 1
            if not warm:
                b, q = load_seen
                if b is not None:
                    busy.append(b)
                if q is not None:
                    runnable.append(q)
            t_phase = _phase(phases, "candidate_windows_and_checks", t_phase)
            bad += res.bad_slots
            checked += res.calls
            if compiled is not None:
                t_ms, _ = windows.WindowTimer(sock, device, draw, compiled, check, deadline).reference_window(
                    sets, layout, device_time=clocked and not timer.as_launched
                )
                if not warm:
                    comp_ms.append(t_ms)
            if warm:
                again = warmups == 2 and on_gpu
                if (warmups == 1 or again) and windows.regrow(
                    plan, res.per_call_ms, cfg.timing.window_ms, min_factor=1.5 if again else 1.0
                ):
                    warmups += 1  # the runner's allocator gets the larger window's blocks before timing
                    plan.warmup_calls = plan.calls if on_gpu else plan.warmup_calls
                continue
            ref_ms.append(r_ms)
            if clocked:
                clock_phases.append(res.phases)
                ref_host.append(ref_host_now)
            if probed:
                by_probe.append((len(cand_ms), res.calls, timed_total, res.open_to_computed_ms))
            cand_ms.append(res.per_call_ms)
            details.append(
                {
                    "calls": res.calls,
                    "reference_ms": round(r_ms, 6),
                    "candidate_ms": round(res.per_call_ms, 6),
                    "wall_ms": round(res.wall_ms, 4),
                    "copies_ms": round(res.copy_ms, 4),
                    "open_ms": round(res.open_ms, 4),
                    "to_computed_ms": round(res.open_to_computed_ms, 4),
                    "after_ms": round(res.after_ms, 4),
                    "probe_fixed_ms": None,  # (filled in below, from all of the stage's probe windows)
                    "runner_says_ms": {
                        str(k)[:20]: v for k, v in list(res.runner_ms.items())[:6] if isinstance(v, (int, float))
                    },
                    "bad_slots": res.bad_slots,
                }
            )
            del sets, ref_outs
    except windows.WindowTimeout as exc:
        judge.set_verdict(
            Status.TIMEOUT,
            f"Timed out in stage 'timing': {exc} (a kernel or loop that never returns, or work that never finishes)",
            Stage.TIMING,
        )
        judge.ask("stop")
        return
    except windows.WindowError as exc:
        judge.set_verdict(Status.RUNTIME_ERROR, str(exc), Stage.TIMING)
        judge.ask("stop")
        return
    finally:
        timer.close()  # the output ring (the runner drops its mapping at its next command)
        if ptimer is not None:
            release_probe(ptimer)
    # every window loses the stage's calibration as it stands at the end (device clock), or the
    # smallest fixed cost the probe saw at its size (a process that slows the probe's windows, or
    # runs beside the judge's copies, can only make them larger)
    for i, ph in enumerate(clock_phases):
        cand_ms[i] = timer.cal.candidate_ms(ph)
        details[i]["candidate_ms"] = round(cand_ms[i], 6)
        details[i]["device_ms"] = {
            "copy_in": round(ph.copy_in_ms, 4),
            "runner": round(ph.middle_ms, 4),
            "snapshot": round(ph.snapshot_ms, 4),
            "measured": {
                "copy_in": round(ph.cal_copy_in_ms, 4),
                "snapshot": round(ph.cal_snapshot_ms, 4),
                "commit": round(ph.cal_commit_ms, 4),
            },
            "off": {k: round(v, 4) for k, v in timer.cal.off(ph).items()},
            # the judge's own wall time from the header to the runner's `armed` (its calls queued;
            # None: not within the head start, and what was left to queue was timed as it came)
            "queued_ms": None if ph.queued_ms is None else round(ph.queued_ms, 4),
            "reference_queued": ph.reference_queued,
            "judge_queued": ph.judge_queued,
        }
    for i, calls, total, before in by_probe:
        if fixed.get(calls):
            f = _off(fixed[calls], before)
            cand_ms[i] = max(total - f, 0.0) / calls
            details[i]["candidate_ms"] = round(cand_ms[i], 6)
            details[i]["probe_fixed_ms"] = round(f, 4)
    judge.checked.append("timed_output_mismatch")
    judge.facts["timed_calls_checked"] = checked
    if bad:
        judge.flag(
            "timed_output_mismatch",
            f"{bad} of {checked} timed calls of ModelNew gave a wrong output for the "
            "inputs they were given (every timed call gets inputs it has never seen: a replayed, cached or "
            "skipped output is wrong, and so is one still being computed when the window closed)",
        )
    c, ref = _stats(cand_ms, 1), _stats(ref_ms, 1)
    if c.median_ms <= 0:
        judge.set_verdict(Status.RUNTIME_ERROR, "The candidate's timing windows measured no time", Stage.TIMING)
        return
    rec.candidate_timing, rec.reference_timing = c, ref
    rec.candidate_ms, rec.reference_ms = c.median_ms, ref.median_ms
    rec.speedup = ref.median_ms / c.median_ms
    launch: dict[str, Any] = {}
    if clocked and not timer.as_launched:
        rows = [
            (r, rh, cm, timer.cal.launch_ms(ph))
            for r, rh, cm, ph in zip(ref_ms, ref_host, cand_ms, clock_phases, strict=True)
        ]
        launch = launch_facts([x for x in rows if x[1] is not None and x[3] is not None])
    if comp_ms:
        cr = _stats(comp_ms, 1)
        rec.compile_reference_timing, rec.compile_reference_ms = cr, cr.median_ms
        rec.speedup_vs_compile = cr.median_ms / c.median_ms
    samples = {"reference": ref_ms, "candidate": cand_ms}
    reasons = stability.sample_problems(samples, cfg.timing)
    load = stability.LoadFacts(
        cores=cores,
        threads=threads,
        others_busy_cores=statistics.fmean(busy) if busy else None,
        others_runnable=statistics.fmean(runnable) if runnable else None,
        loadavg_1m=os.getloadavg()[0],
    )
    if not on_gpu:  # (on a GPU the runner is another process on the device by design)
        reasons += stability.load_problems(load, cfg.timing, on_gpu)
    if clocked and timer.cal.contended():
        reasons.append(timer.cal.contended())
    if reasons:
        judge.flag("timing_unstable", "; ".join(reasons[:5]))
    rec.metadata["timing"] = {
        "clock": "judge",
        "calls_per_window": plan.calls,
        "windows": details,
        "plan": plan.reasons,
        "estimate_ms": round(est_ms, 6),
        "fixed_costs": fixed_by,
        "device_clock": _clock_facts(judge, timer) if clocked else {"off": _clock_off(judge, on_gpu)},
        "launch": launch,
        "probe_windows": probe_seen[:12],
        "threads": None if on_gpu else threads,
        "judge_phases_s": phases,
        "attempts": 1,
        "unstable": reasons,
        "load": {
            "others_busy_cores": load.others_busy_cores,
            "others_runnable": load.others_runnable,
            "loadavg_1m": load.loadavg_1m,
        },
        "drift": {k: stability.drift(v) for k, v in samples.items() if v},
        "band": {k: stability.band(v) for k, v in samples.items() if v},
    }
    physics(judge, inputs0)


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
    import statistics

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


def _probe_process(judge: Judge, wait_s: float = 0.0) -> tuple[Any, str]:
    """The judge's probe, ready (or None and why not): the process both clocks open windows on."""
    if not judge.cfg.timing.probe:
        return None, "timing.probe is off"
    from kernelwright.engine.child import probe

    p = probe.start(judge.device)
    if p is None or not p.wait_ready(wait_s or PROBE_READY_S):
        return None, p.failed if p is not None else "no probe on this device"
    return p, ""


def switch_timer(
    judge: Judge, cal: Any, deadline: Callable[[float], float], windows_first: int = 3, wait_s: float = 0.0
) -> tuple[windows.WindowTimer | None, str]:
    """The probe's timer for the device clock's empty windows (the two context switches into
    `cal`), after `windows_first` of them; None and why where there is no probe or they failed
    (then nothing comes off for the switches)."""
    from kernelwright.engine.child import device_clock

    p, why = _probe_process(judge, wait_s)
    if p is None:
        return None, f"device clock; no probe ({why}): the context switches stay in"
    # (empty windows call no model: at the judge's start-up there is no reference yet)
    pt = windows.WindowTimer(p.sock, judge.device, list, _no_model, lambda e, r: True, deadline)
    pt.clock = device_clock.Clock(judge.device)
    for _ in range(windows_first):
        if _switch_window(pt, cal) is None:
            pt.close()
            return None, "device clock; the probe's empty windows failed: the context switches stay in"
    return pt, "device clock"


def _no_model(*args: Any) -> None:
    return None


def _switch_window(ptimer: windows.WindowTimer, cal: Any) -> windows.WindowTimer | None:
    """One empty window on the probe: its context switches into the calibration. A probe that
    fails is dropped (nothing more comes off for the switches), never the candidate's fault."""
    from kernelwright.engine.child import probe

    try:
        ms = ptimer.empty_window()
    except Exception as exc:  # (the probe's or the driver's: whatever it is, not the candidate's)
        probe.drop(ptimer.device, f"an empty window failed: {exc}")
        return None
    if ms is not None:
        cal.see_switch(ms)
        cal.see_armed(ptimer.clock.queued_ms)
    return ptimer


def _clock_off(judge: Judge, on_gpu: bool) -> str:
    if not on_gpu:
        return "a CPU evaluation: the judge's wall clock"
    if not judge.cfg.timing.device_clock:
        return "timing.device_clock is off"
    return judge.device_clock_off or "not measured at the judge's start-up"


def _clock_facts(judge: Judge, timer: windows.WindowTimer) -> dict[str, Any]:
    cal = timer.cal
    return {
        "anchor": judge.anchor.to_json() if judge.anchor is not None else None,
        "contended": cal.contended(),
        "copy_in_ms": {str(k): round(v, 4) for k, v in cal.copy_in.items()},
        "snapshot_ms": {str(k): round(v, 4) for k, v in cal.snapshot.items()},
        "commit_ms": {f"{k[0]}/{k[1]}": round(v, 4) for k, v in cal.commit.items()},
        "switch_ms": None if cal.switch is None else round(cal.switch, 4),
        "switch_windows_ms": [round(x, 4) for x in cal.switches[:24]],
    }


def _probe_timer(
    judge: Judge, timer: windows.WindowTimer, draw: Callable[[], list[Any]], deadline: Callable[[float], float]
) -> tuple[windows.WindowTimer | None, str]:
    """The probe's windows (sharing the runner's output ring), or None and why not."""
    p, why = _probe_process(judge)
    if p is None:
        return None, f"the judge's own measures ({why})"
    pt = windows.WindowTimer(p.sock, judge.device, draw, judge.ref_model, lambda e, r: True, deadline)
    pt.ring_owner = timer
    return pt, "probe"


PROBE_READY_S = 60.0


# a probe window run while other processes kept this many cores busier than they did over the
# reference's window just before (the runner and the probe poll in both; other evaluations on the
# host load both alike), or three quarters of the cores busy, ran beside load from elsewhere: its
# opening is left out
PROBE_BUSY_CORES = 2.0


def _off(fixed: list[float] | None, before_ms: float) -> float:
    """What comes off a window for its opening: the smallest the probe measured at its size, over
    its windows that ran on a quiet machine (a process that slows the probe's windows can only
    make them larger; one that loads the cores while they run gets them left out), never more
    than half of the window's own time up to `computed` (as for the judge's own measure of it)."""
    return min(min(fixed), 0.5 * before_ms) if fixed else 0.0


def _probe_window(
    ptimer: windows.WindowTimer,
    sets: list[list[Any]],
    layout: windows.Layout,
    ref_outs: list[Any],
    r_ms: float,
    fixed: dict[int, list[float]],
    seen: list[dict[str, Any]],
    busy_before: float | None,
) -> tuple[windows.WindowTimer | None, str]:
    """One probe window on the candidate's sets: its cost besides the calls into `fixed`. A probe
    that fails is dropped (the later windows fall back to the judge's own measures), never the
    candidate's fault."""
    from kernelwright.engine.child import probe, stability

    monitor = stability.CpuLoadMonitor()
    try:
        res = ptimer.candidate_window(sets, layout, ref_outs, expected_ms=2 * r_ms, measures=windows.Measures(0.0, 0.0))
    except windows.WindowError as exc:
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


def release_probe(ptimer: windows.WindowTimer) -> None:
    """The probe drops its mapping of the output ring (it lives on with the judge)."""
    from kernelwright.engine.child import shared_region

    try:
        shared_region.send(ptimer.sock, b'{"release": 1}', [])
    except OSError:
        pass
    ptimer.close()  # (the device clock's flags; the ring is the candidate timer's)


def physics(judge: Judge, inputs: Any) -> None:
    """The candidate's time against the roofline floor of the device (peaks from its facts)."""
    from kernelwright.core import roofline

    judge.checked.append("faster_than_hardware")
    try:
        facts = judge.device_facts()
        work = judge.reference_work(inputs)
        peak_flops, peak_bw, source = roofline.choose_peaks(facts, work["precision"])
        if not peak_bw or not judge.rec.candidate_ms:
            judge.facts["physics"] = "no bandwidth peak known for this device: not checked"
            return
        r = roofline.compute(
            work["flops"], work["min_bytes"], judge.rec.candidate_ms, peak_bw, peak_flops, source, work["precision"]
        )
        judge.facts["physics"] = {
            "floor_ms": r.floor_ms,
            "fraction_of_floor": r.fraction_of_floor,
            "peak_source": source,
        }
        if not peaks_hold(judge.rec.reference_ms, r.floor_ms):
            # the reference itself beat the floor: the peaks are no ceiling (a measurement taken on
            # a loaded machine, a wrong datasheet): nothing is flagged, and a measured peak is
            # measured again by the next evaluation
            judge.facts["physics"] = (
                f"not checked: the reference ran in {judge.rec.reference_ms:.4g} ms, under the floor of "
                f"{r.floor_ms:.4g} ms the peaks ({source}) give"
            )
            if source == "measured":
                from kernelwright.engine.child import gpu_facts

                gpu_facts.forget_measured(judge.device, judge.cfg.cache_dir)
            return
        if judge.rec.candidate_ms < judge.cfg.timing.physics_margin * r.floor_ms:
            judge.flag(
                "faster_than_hardware",
                f"the judge measured {judge.rec.candidate_ms:.4g} ms a call, under "
                f"{judge.cfg.timing.physics_margin:g} x the roofline floor of {r.floor_ms:.4g} ms "
                f"({r.bound}-bound, {source}): a forged timer or skipped work; the speed-up is not trusted",
            )
    except Exception as exc:
        judge.facts["physics"] = f"not checked: {type(exc).__name__}: {str(exc)[:200]}"


def peaks_hold(reference_ms: float | None, floor_ms: float) -> bool:
    """Are the peaks a ceiling? Not when the reference, timed by the judge, ran faster than the
    floor they give: then no candidate can be judged against them."""
    return reference_ms is None or reference_ms >= floor_ms
