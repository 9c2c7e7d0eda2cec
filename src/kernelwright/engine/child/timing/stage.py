"""The timing stage: windows on the judge's clock, their checks, and whether to trust the figures.

`run(job)` plans the windows from the reference's own time and the memory at hand, runs one
warm-up window (more where it grows the windows) and then `timing.windows` pairs (reference
window, then candidate window, each on a fresh draw from the judge's secret stream; on a GPU,
`timing.more_windows` more pairs once where a side's windows spread), and returns the outcome.
Nothing the runner reports about time enters: the candidate's figure is the judge's clock around
the window (the package's docstring), and every timed output is held to the job's bound against
the reference's output for the same inputs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from kernelwright.core.record import Status
from kernelwright.engine.child.compare import flatten, tensor_bytes
from kernelwright.engine.child.degenerate import alike, fingerprint, identical
from kernelwright.engine.child.problem_io import sync
from kernelwright.engine.child.timing import device_clock, stability
from kernelwright.engine.child.timing.job import TimingFailure, TimingJob, TimingOutcome
from kernelwright.engine.child.timing.layouts import Layout, WindowError
from kernelwright.engine.child.timing.probe_windows import (
    off,
    probe_timer,
    probe_window,
    release_probe,
    switch_timer,
    switch_window,
)
from kernelwright.engine.child.timing.summary import stats_of
from kernelwright.engine.child.timing.window_facts import clock_facts, clock_off, launch_facts, launch_gap
from kernelwright.engine.child.timing.window_io import WindowTimeout
from kernelwright.engine.child.timing.window_plan import (
    Measures,
    Plan,
    budget_bytes,
    ceiling,
    fit_queue,
    out_of_memory,
    plan,
    regrow,
)
from kernelwright.engine.child.timing.window_timer import WindowResult, WindowTimer
from kernelwright.engine.child.trees import clone


def run(job: TimingJob) -> TimingOutcome:
    """The timing stage, whole. A window that fails or times out is the candidate's failure in
    the outcome; any other exception is the judge's own and propagates."""
    on_gpu = job.device.type == "cuda"
    cores = stability.available_cores()
    threads = stability.resolve_threads(job.config, cores)
    prev_threads = torch.get_num_threads()
    if not on_gpu:  # one fixed thread count for both sides, recorded (the runner is told it too)
        torch.set_num_threads(threads)
    try:
        return _Stage(job, on_gpu, cores, threads).run()
    finally:
        torch.set_num_threads(prev_threads)


def _stats(samples: list[float], warmup: int) -> Any:
    return stats_of(samples, warmup, clock="judge_window", flush=False)


@dataclass
class _Round:
    """One pair of windows: the reference's, then the candidate's on the same sets."""

    res: WindowResult
    sets: list[list[Any]]
    layout: Layout
    r_ms: float
    ref_host: float | None  # the host's time to queue a reference call (device clock), else None
    load: tuple[float | None, float | None]  # (others' busy cores, others' runnable) over the reference's window
    timed_total: float  # the candidate window's time before the probe's opening came off
    probed: bool


class _Stage:
    def __init__(self, job: TimingJob, on_gpu: bool, cores: int, threads: int):
        self.job, self.on_gpu, self.cores, self.threads = job, on_gpu, cores, threads
        self.out = TimingOutcome()
        self.timer = WindowTimer(
            job.sock, job.device, job.draw, job.reference, job.bound.allows, job.deadline,
            threads=None if on_gpu else threads,
        )  # fmt: skip
        self.ref_ms: list[float] = []
        self.cand_ms: list[float] = []
        self.comp_ms: list[float] = []
        self.phases: dict[str, float] = {}  # the judge's own time in the timing stage, by phase
        self.busy: list[
            float
        ] = []  # cores other processes kept busy while the reference was timed (the runner idles then)
        self.runnable: list[float] = []
        self.seen: list[Measures] = []  # the judge's per-call measures of the windows' own costs
        self.details: list[dict[str, Any]] = []
        self.bad = self.checked = 0
        # whether the reference's outputs of the stage's draws differ (the degenerate check's other
        # evidence: a handful of trials can all draw the same output from a reference that rarely
        # leaves it, a ReLU behind a large shift); the first window's first output's fingerprint to
        # compare the next windows' with (no tensor kept: the next round reuses the freed memory)
        self.first_ref: Any = None
        self.ref_varies = False
        # on a GPU the judge's stream spans the runner's work (device_clock.py), where the driver can;
        # else a trusted probe process measures what a window costs besides the calls (probe.py)
        self.clocked = on_gpu and job.anchor is not None and job.config.device_clock
        self.clock_phases: list[Any] = []  # the timed windows' device_clock.Phases, in order (device clock)
        self.ref_host: list[float | None] = []  # the host's time to queue a reference call, by timed window
        self.fixed: dict[int, list[float]] = {}  # sets per window -> the probe windows' openings (ms)
        # timed windows the probe's opening comes off: (index, calls, their time so far, their opening's ms)
        self.by_probe: list[tuple[int, int, float, float]] = []
        self.probe_seen: list[dict[str, Any]] = []  # the probe's windows, as evidence
        self.ptimer: WindowTimer | None = None
        self.fixed_by = ""
        self.compiled: Any = None
        self.more: dict[str, Any] | None = None  # more windows timed, and why (`more_rounds`)

    def run(self) -> TimingOutcome:
        self.est_ms, self.plan = self.plan_windows()
        self.compiled = self.compiled_reference()
        self.open_clocks()
        try:
            self.windows()
        except WindowTimeout as exc:
            self.out.failure = TimingFailure(
                Status.TIMEOUT,
                f"Timed out in stage 'timing': {exc} "
                "(a kernel or loop that never returns, or work that never finishes)",
            )
            return self.out
        except WindowError as exc:
            self.out.failure = TimingFailure(Status.RUNTIME_ERROR, str(exc))
            return self.out
        finally:
            self.timer.close()  # the output ring (the runner drops its mapping at its next command)
            if self.ptimer is not None:
                release_probe(self.ptimer)
        self.settle()
        self.summarise()
        return self.out

    # ---- before the windows ---------------------------------------------------------------------
    def plan_windows(self) -> tuple[float, Plan]:
        """The reference's time per call on the trials' inputs, and the windows' plan from it."""
        job, cfg = self.job, self.job.config
        with torch.no_grad():
            job.reference(*clone(job.inputs))
            copies = [clone(job.inputs) for _ in range(3)]  # made before the clock: a copy is not the reference's work
            sync(job.device)
            t0 = time.perf_counter()
            for args in copies:
                job.reference(*args)
            sync(job.device)
        est_ms = (time.perf_counter() - t0) * 1e3 / 3
        del copies
        return est_ms, plan(
            est_ms,
            tensor_bytes(job.inputs),
            tensor_bytes(job.reference_output),
            budget_bytes(cfg, job.device),
            cfg.window_ms,
            cfg.windows,
            cfg.max_window_calls,
        )

    def compiled_reference(self) -> Any:
        """torch.compile(reference), warmed, where `compare_compile` asks for it (None if it fails)."""
        if not self.job.config.compare_compile:
            return None
        try:
            compiled = torch.compile(self.job.reference)
            with torch.no_grad():
                compiled(*clone(self.job.inputs))
            return compiled
        except Exception as exc:
            self.out.metadata["compile_reference_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return None

    def open_clocks(self) -> None:
        """The device clock and its probe's empty windows, or the probe's windows on the wall clock."""
        job, timer = self.job, self.timer
        if self.clocked:
            timer.clock = device_clock.Clock(job.device)
            timer.cal = device_clock.Calibration(anchor=job.anchor)
            self.ptimer, self.fixed_by = switch_timer(job.device, job.config, timer.cal, job.deadline)
        elif self.on_gpu:
            self.ptimer, self.fixed_by = probe_timer(
                job.device, job.config, timer, job.draw, job.reference, job.deadline
            )

    # ---- the windows ----------------------------------------------------------------------------
    def phase(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - t0, 4)
        return now

    def windows(self) -> None:
        # one warm-up window; another when it grows the windows. On a GPU a grown warm-up window
        # is looked at once more: the first one's per-call time carries its fixed costs over few
        # calls (and the first calls' own), so it sizes the windows short, by an amount that varies
        # from run to run, and a launch-bound candidate's figure with it (docs/PERFORMANCE.md)
        job, plan_, timer = self.job, self.plan, self.timer
        warmups = 1
        r = shrunk = 0
        rounds = plan_.rounds
        while r < rounds + warmups:
            warm = r < warmups
            shrink = False
            try:
                w, t_phase = self.one_round(warm)
            except Exception as exc:  # memory other evaluations took since the plan: smaller windows
                # (the judge's own allocations only: a candidate that failed in its window, out of
                # memory or not, is the runner's error and ended the runner)
                if isinstance(exc, WindowError) or not out_of_memory(exc) or plan_.calls <= 1 or shrunk >= 6:
                    raise
                shrink = True
            if shrink:  # (out of the handler: the failed round's sets are freed by now)
                shrunk += 1
                self.shrink()
                continue
            r += 1
            if not warm:
                b, q = w.load
                if b is not None:
                    self.busy.append(b)
                if q is not None:
                    self.runnable.append(q)
            t_phase = self.phase("candidate_windows_and_checks", t_phase)
            self.bad += w.res.bad_slots
            self.checked += w.res.calls
            if self.compiled is not None:
                t_ms, _ = WindowTimer(
                    job.sock, job.device, job.draw, self.compiled, job.bound.allows, job.deadline
                ).reference_window(w.sets, w.layout, device_time=self.clocked and not timer.as_launched)
                if not warm:
                    self.comp_ms.append(t_ms)
            if warm:
                # the warm-up's sets and outputs freed before the next round draws its own: its memory
                # is what the timed windows reuse (heap.py), as the runner reuses its warm-up's
                fastest = min(w.res.per_call_ms, w.r_ms)
                del w
                side = self.unqueued()
                if side and fit_queue(plan_, side):
                    timer.requeue()
                    warmups += 1  # the shorter windows warmed up, and looked at, once more
                    continue
                again = warmups == 2 and self.on_gpu
                # sized by the faster of the two windows' per-call times: the reference's own window
                # (trusted) corrects an estimate that a burst of load, or first calls, made too long
                if (warmups == 1 or again) and regrow(
                    plan_, fastest, job.config.window_ms, min_factor=1.5 if again else 1.0
                ):
                    warmups += 1  # the runner's allocator gets the larger window's blocks before timing
                    plan_.warmup_calls = plan_.calls if self.on_gpu else plan_.warmup_calls
                continue
            self.keep(w)
            del w
            if r == rounds + warmups and rounds == plan_.rounds:
                rounds += self.more_rounds()

    def more_rounds(self) -> int:
        """On a GPU, once the planned windows are timed: more pairs where a side's windows spread
        (slowest / fastest, as timed, before the stage's calibration comes off) beyond
        `more_windows_band` (TimingConfig), recorded with why (0: none)."""
        cfg = self.job.config
        if not self.on_gpu or cfg.more_windows <= 0 or cfg.more_windows_band <= 1.0:
            return 0
        spread = {
            side: max(ms) / min(ms)
            for side, ms in (("reference", self.ref_ms), ("candidate", self.cand_ms))
            if ms and min(ms) > 0
        }
        wide = {side: s for side, s in spread.items() if s > cfg.more_windows_band}
        if not wide:
            return 0
        self.more = {
            "added": cfg.more_windows,
            "why": ", ".join(f"the {side}'s windows spread {s:.3g}x" for side, s in wide.items()),
        }
        return cfg.more_windows

    def unqueued(self) -> str:
        """On the device clock, the side whose last window could not be queued whole before the
        device began on it ("" where both were, or off the device clock)."""
        timer = self.timer
        if not self.clocked:
            return ""
        if timer.as_launched or not timer.ref_queued:
            return "the reference"
        if timer.clock is not None and timer.clock.queued_ms is None:
            return "the candidate"
        return ""

    def note_variation(self, ref_outs: list[Any]) -> None:
        """Whether a window's reference outputs differ from one another or, by fingerprint, from the
        stage's first window's (looked at until they do)."""
        if self.ref_varies or not ref_outs:
            return
        head = ref_outs[0]
        prints = [fingerprint(t) for _, t in flatten(head) if isinstance(t, torch.Tensor)]
        if self.first_ref is None:
            self.first_ref = prints
        self.ref_varies = any(not identical(o, head) for o in ref_outs[1:]) or not alike(prints, self.first_ref)

    def one_round(self, warm: bool) -> tuple[_Round, float]:
        """A reference window, the judge's measures of a window's own costs, the candidate's window
        (and the probe's after it): the round, and the clock where its last phase began."""
        timer, plan_ = self.timer, self.plan
        t_phase = time.perf_counter()
        sets, layout = timer.pool(plan_.warmup_calls if warm else plan_.calls)
        t_phase = self.phase("draws", t_phase)
        # the load other processes make is read over the reference's window and the judge's
        # measures of the window's own costs, taken right after it (the runner waits then)
        monitor = stability.CpuLoadMonitor()
        r_ms, ref_outs = timer.reference_window(sets, layout)
        ref_host = timer.ref_host_ms if self.clocked and timer.ref_queued and not timer.as_launched else None
        monitor.tick()
        # (the probe's window after the candidate's measures the opening)
        probed = self.ptimer is not None and not self.clocked
        if self.clocked:
            measured = Measures(0.0, 0.0)  # (the device clock calibrates itself)
        else:
            measured = timer.measures(sets, layout, ref_outs, opening=not probed)
            self.seen.append(measured.per_call(len(sets)))
        load = monitor.others_busy_cores(), monitor.others_runnable()
        t_phase = self.phase("reference_windows", t_phase)
        res = timer.candidate_window(
            sets,
            layout,
            ref_outs,
            # (a warm-up window's deadline from the smaller of the two: the first reference
            # window pays one-time page faults, and the warm-up is as large as the others)
            expected_ms=2.0 * min(r_ms, self.est_ms) if warm else r_ms,
            measures=measured,
            ceiling=ceiling(self.seen),
        )
        self.note_variation(ref_outs)  # (after the candidate's window: no judge work between the two)
        if self.clocked and self.ptimer is not None:
            self.ptimer = switch_window(self.ptimer, timer.cal)
        elif self.ptimer is not None:
            self.ptimer, why = probe_window(
                self.ptimer, sets, layout, ref_outs, r_ms, self.fixed, self.probe_seen, load[0]
            )
            self.fixed_by = why or self.fixed_by
        timed_total = res.per_call_ms * res.calls
        if probed:
            f = off(self.fixed.get(res.calls), res.open_to_computed_ms)
            res.per_call_ms = max(timed_total - f, 0.0) / res.calls
        return _Round(res, sets, layout, r_ms, ref_host, load, timed_total, probed), t_phase

    def shrink(self) -> None:
        """Half as many sets per window, after the judge's own memory ran out."""
        p = self.plan
        self.timer.close()  # a smaller ring for the smaller windows
        if self.on_gpu:
            torch.cuda.empty_cache()
        p.calls = p.limit = max(1, p.calls // 2)
        p.warmup_calls = min(p.warmup_calls, p.calls)
        p.reasons.append(f"{p.calls} sets per window (out of device memory with twice as many)")

    def keep(self, w: _Round) -> None:
        """A timed round's figures."""
        res = w.res
        self.ref_ms.append(w.r_ms)
        if self.clocked:
            self.clock_phases.append(res.phases)
            self.ref_host.append(w.ref_host)
        if w.probed:
            self.by_probe.append((len(self.cand_ms), res.calls, w.timed_total, res.open_to_computed_ms))
        self.cand_ms.append(res.per_call_ms)
        self.details.append(
            {
                "calls": res.calls,
                "reference_ms": round(w.r_ms, 6),
                "candidate_ms": round(res.per_call_ms, 6),
                "wall_ms": round(res.wall_ms, 4),
                "copies_ms": round(res.copy_ms, 4),
                "open_ms": round(res.open_ms, 4),
                "to_computed_ms": round(res.open_to_computed_ms, 4),
                "after_ms": round(res.after_ms, 4),
                "probe_fixed_ms": None,  # (filled in by `settle`, from all of the stage's probe windows)
                "runner_says_ms": {
                    str(k)[:20]: v for k, v in list(res.runner_ms.items())[:6] if isinstance(v, (int, float))
                },
                "bad_slots": res.bad_slots,
                "bad_at": res.bad_at,
            }
        )

    # ---- after the windows ----------------------------------------------------------------------
    def settle(self) -> None:
        """Every window loses the stage's calibration as it stands at the end (device clock), or the
        smallest fixed cost the probe saw at its size (a process that slows the probe's windows, or
        runs beside the judge's copies, can only make them larger)."""
        cal, cand_ms, details = self.timer.cal, self.cand_ms, self.details
        for i, ph in enumerate(self.clock_phases):
            cand_ms[i] = cal.candidate_ms(ph)
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
                "off": {k: round(v, 4) for k, v in cal.off(ph).items()},
                # the judge's own wall time from the header to the runner's `armed` (its calls queued;
                # None: not within the head start, and what was left to queue was timed as it came)
                "queued_ms": None if ph.queued_ms is None else round(ph.queued_ms, 4),
                "reference_queued": ph.reference_queued,
                "judge_queued": ph.judge_queued,
            }
        for i, calls, total, before in self.by_probe:
            if self.fixed.get(calls):
                f = off(self.fixed[calls], before)
                cand_ms[i] = max(total - f, 0.0) / calls
                details[i]["candidate_ms"] = round(cand_ms[i], 6)
                details[i]["probe_fixed_ms"] = round(f, 4)

    def summarise(self) -> None:
        """The statistics, the flags and the stage's metadata into the outcome."""
        out, cfg, timer = self.out, self.job.config, self.timer
        out.checked.append("timed_output_mismatch")
        out.facts["timed_calls_checked"] = self.checked
        out.facts["timed_reference_outputs_vary"] = self.ref_varies
        if self.bad:
            out.flags["timed_output_mismatch"] = (
                f"{self.bad} of {self.checked} timed calls of ModelNew gave a wrong output for the "
                "inputs they were given (every timed call gets inputs it has never seen: a replayed, cached or "
                "skipped output is wrong, and so is one still being computed when the window closed)"
            )
        c, ref = _stats(self.cand_ms, 1), _stats(self.ref_ms, 1)
        if c.median_ms <= 0 and not self.bad:
            out.failure = TimingFailure(
                Status.RUNTIME_ERROR, "The candidate's timing windows measured no time", stop=False
            )
            return
        if c.median_ms > 0:
            out.candidate, out.reference = c, ref
        # (else no time inside the judge's span, and wrong slots: work done outside the window, before
        # its inputs landed or after the commit read its outputs. The wrong outputs are the verdict,
        # `timed_output_mismatch`; the stage's evidence is still recorded below, and no speed-up.)
        launch: dict[str, Any] = {}
        if self.clocked and not timer.as_launched:
            rows = [
                (r, rh, cm, timer.cal.launch_ms(ph))
                for r, rh, cm, ph in zip(self.ref_ms, self.ref_host, self.cand_ms, self.clock_phases, strict=True)
            ]
            launch = launch_facts([x for x in rows if x[1] is not None and x[3] is not None])
            out.basis = "device"
            out.speedup_as_launched = launch.get("speedup_as_launched")
            out.checked.append("launch_bound")
            per_call = {"reference": ref.median_ms, "candidate": c.median_ms}
            gap = launch_gap(out.speedup, launch, per_call, cfg.max_launch_gap)
            if gap:
                out.flags["launch_bound"] = gap
        else:
            out.speedup_as_launched = out.speedup
        if self.comp_ms:
            out.compiled_reference = _stats(self.comp_ms, 1)
        samples = {"reference": self.ref_ms, "candidate": self.cand_ms}
        load = stability.LoadFacts(
            cores=self.cores,
            threads=self.threads,
            others_busy_cores=statistics.fmean(self.busy) if self.busy else None,
            others_runnable=statistics.fmean(self.runnable) if self.runnable else None,
            loadavg_1m=os.getloadavg()[0],
        )
        reasons = stability.assess(samples, load, cfg, self.on_gpu, self.plan.rounds)
        if self.clocked and timer.cal.contended():
            reasons.append(timer.cal.contended())
        shared = self.job.shared()
        if shared:
            reasons.append(shared)
        if not self.clocked:  # the judge's wall clock: windows whose fixed costs did not all come off
            judged, said = [], []
            for d in self.details:
                runner_calls = d["runner_says_ms"].get("calls")
                if isinstance(runner_calls, (int, float)):
                    judged.append(d["candidate_ms"])
                    said.append(runner_calls / max(d["calls"], 1))
            why = stability.unresolved(judged, said, cfg.max_unresolved)
            if why:
                reasons.append(why)
            why = stability.ratio_spread(self.ref_ms, self.cand_ms, cfg.max_ratio_spread)  # (timed windows only)
            if why:
                reasons.append(why)
        if reasons:
            out.flags["timing_unstable"] = "; ".join(reasons[:5])
        out.metadata["timing"] = {
            "clock": "judge",
            "calls_per_window": self.plan.calls,
            "windows": self.details,
            "plan": self.plan.reasons,
            "estimate_ms": round(self.est_ms, 6),
            "fixed_costs": self.fixed_by,
            "device_clock": clock_facts(self.job.anchor, timer)
            if self.clocked
            else {"off": clock_off(self.on_gpu, cfg.device_clock, self.job.device_clock_off)},
            "launch": launch,
            "probe_windows": self.probe_seen[:12],
            "threads": None if self.on_gpu else self.threads,
            "judge_phases_s": self.phases,
            "attempts": 1,
            "more_windows": self.more,  # (None: the planned windows only)
            "unstable": reasons,
            "load": {
                "others_busy_cores": load.others_busy_cores,
                "others_runnable": load.others_runnable,
                "loadavg_1m": load.loadavg_1m,
            },
            "drift": {k: stability.drift(v[: self.plan.rounds]) for k, v in samples.items() if v},
            "band": {k: stability.band(v) for k, v in samples.items() if v},
        }
