"""The judge's hand-off to the timing stage (`engine/child/timing/`): the job from what the
judge holds, the outcome into its record, then the physics check of the candidate's time.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any

from kernelwright.core import roofline
from kernelwright.core.record import Stage, Status
from kernelwright.engine.child import evidence, gpu_facts
from kernelwright.engine.child.gpu_turn import GpuTurn, gpu_key
from kernelwright.engine.child.judge_profile import JudgeProfile
from kernelwright.engine.child.problem_io import trial_seed
from kernelwright.engine.child.timing import TimingJob, TimingOutcome, gpu_load, probe
from kernelwright.engine.child.timing import run as run_timing
from kernelwright.engine.child.timing.probe_windows import ANCHOR_PROBE_S, measure_anchor, switch_ms

TIMING_SEED_OFFSET = 10**9  # the timing draws' seeds are not the checks' seeds


class JudgeTiming(JudgeProfile):
    def take_turn(self) -> None:
        """On a GPU, wait for the device's turn (gpu_turn.py) before the first check is sent: the
        coordinator stops the runner's clocks while the judge is at work on a report, so the wait is
        no stage's time. Held until the record is sent (`finish`), or the process ends."""
        wait = self.cfg.timing.gpu_turn_wait_s
        if self.turn is not None or self.device.type != "cuda" or wait <= 0:
            return
        try:
            key = gpu_key(self.device)
        except Exception as exc:  # (no identity, no turn: recorded, and the evaluation goes on)
            self.rec.metadata["gpu_turn"] = {"none": f"no identity for the GPU: {type(exc).__name__}: {exc}"[:300]}
            return
        self.turn = GpuTurn(key, wait).take()
        if self.anchor is not None and self.cfg.timing.device_clock:  # again, in the turn (device_clock.Anchor)
            self.anchor.see_in_turn(switch_ms(self.device, self.cfg.timing))

    def measure_anchor(self) -> None:
        """The device clock's yardstick, before any candidate code has run (probe_windows.measure_anchor),
        in the GPU's turn: its empty windows neither run beside another evaluation's timing windows
        nor take their hand-overs' length from them. The probe starts up outside the turn; the
        turn is let go as soon as the windows are done. At start-up the judge knows only its
        device (a spare's job comes later): the turn's wait is the default's."""
        wait = self.cfg.timing.gpu_turn_wait_s
        if self.cfg.timing.probe and self.cfg.timing.device_clock and self.handoff is not None:
            p = probe.start(self.device)
            if p is not None:
                p.wait_ready(ANCHOR_PROBE_S)
        turn, how = None, "no turns (timing.gpu_turn_wait_s = 0)"
        if wait > 0:
            try:
                turn = GpuTurn(gpu_key(self.device), wait).take()
            except Exception as exc:  # (no identity, no turn: the anchor is measured all the same)
                how = f"none: no identity for the GPU: {type(exc).__name__}: {exc}"[:300]
        try:
            self.anchor, self.device_clock_off = measure_anchor(self.device, self.cfg.timing, self.handoff is not None)
        finally:
            if turn is not None:
                how = turn_said(turn)
                turn.release()
        if self.anchor is not None:
            self.anchor.startup_turn = how

    def warm_in_background(self) -> None:
        """The FLOP counter's first use (the physics check counts the reference's work with it)
        imports torch._dynamo: 3-5 s, once per process, at the end of every evaluation of a new
        problem. Started here, in a thread, while the job and the runner's build are on their way;
        the timing stage waits for it (`warmed`) so that no import runs beside a timing window."""
        if self._warming is not None:
            return

        self._warming = threading.Thread(target=evidence.warm_flop_counter, name="kw-warm-flop-counter", daemon=True)
        self._warming.start()

    def warm_if_uncounted(self) -> None:
        """On the CPU (a GPU judge warms at its start-up): the same warm-up, started once the job's
        problem is loaded, while the runner starts, builds and is checked, where the judge will
        count this problem's work (it is timed, and its work is not in the judge's cache) and nothing
        warmed this process before (a judge forked from its zygote is warm already)."""
        if "torch._dynamo" in sys.modules or not self.cfg.time_candidate:
            return
        if evidence.work_cached(self.cfg.cache_dir, self.device, self.job.problem_source):
            return
        self.warm_in_background()

    def warmed(self, timeout_s: float = 60.0) -> None:
        if self._warming is not None:
            self._warming.join(timeout_s)

    def time_windows(self) -> None:
        """The timing stage (`timing.run`) on the judge's own clock, its outcome into the record."""
        t0 = time.perf_counter()
        back_to = self.current_stage
        self.enter_stage("timing")  # the runner no longer times: the timing stage is the judge's windows
        try:
            self.warmed()  # no import of the judge's runs beside its windows
            if self.handoff is None:
                self.set_verdict(
                    Status.ENGINE_ERROR,
                    "The judge has no socket to the runner: timing windows cannot run "
                    "(an engine bug, not the candidate's fault)",
                    Stage.TIMING,
                )
                return
            ref_out, _, inputs = self.reference(trial_seed(self.secret, 0))
            since = gpu_load.now_us()
            outcome = run_timing(self.timing_job(self.handoff, inputs, ref_out))
            if self.device.type == "cuda" and self.turn is not None:  # (evidence: read at `finish`)
                self.gpu_query = gpu_load.Query(self.turn.key, since)
            if self.take_timing(outcome):
                self.physics(inputs)
        finally:
            self.busy_s["timing_windows"] = self.busy_s.get("timing_windows", 0.0) + time.perf_counter() - t0
            self.enter_stage(back_to)

    def timing_job(self, sock: socket.socket, inputs: Any, ref_out: Any) -> TimingJob:
        """What the timing stage may use: fresh draws from the judge's secret stream, its reference,
        and the bound the passed trials set for a timed output."""
        counter = [0]

        def draw() -> list[Any]:
            counter[0] += 1
            drawn = self.io.inputs(self.secret + TIMING_SEED_OFFSET + counter[0])
            return list(drawn) if isinstance(drawn, (list, tuple)) else [drawn]

        return TimingJob(
            device=self.device,
            sock=sock,
            config=self.cfg.timing,
            draw=draw,
            reference=self.ref_model,
            inputs=inputs,
            reference_output=ref_out,
            bound=self.timed_bound,
            anchor=self.anchor,
            device_clock_off=self.device_clock_off,
            shared=self.turn.check if self.turn is not None else (lambda: ""),
        )

    def take_timing(self, outcome: TimingOutcome) -> bool:
        """The outcome into the record: its facts, flags and figures, or its failure. True when
        the candidate was timed."""
        rec = self.rec
        rec.metadata.update(outcome.metadata)
        self.checked += outcome.checked
        self.facts.update(outcome.facts)
        for name, detail in outcome.flags.items():
            self.flag(name, detail)
        if outcome.failure is not None:
            f = outcome.failure
            self.set_verdict(f.status, f.log, f.stage)
            if f.stop:
                self.ask("stop")
            return False
        c, ref = outcome.candidate, outcome.reference
        if c is None or ref is None:
            return False
        rec.candidate_timing, rec.reference_timing = c, ref
        rec.speedup_basis, rec.speedup_as_launched = outcome.basis, outcome.speedup_as_launched
        rec.candidate_ms, rec.reference_ms = c.median_ms, ref.median_ms
        rec.speedup = outcome.speedup
        if outcome.compiled_reference is not None:
            rec.compile_reference_timing = outcome.compiled_reference
            rec.compile_reference_ms = outcome.compiled_reference.median_ms
            rec.speedup_vs_compile = outcome.speedup_vs_compile
        return True

    def physics(self, inputs: Any) -> None:
        """The candidate's time against the least any candidate must do: write its outputs' bytes at
        the device's peak bandwidth. Never the reference's FLOPs or reads: a candidate may skip
        work the reference does (half of a triangular product, a branch whose result is unused)."""
        self.checked.append("faster_than_hardware")
        try:
            facts = self.device_facts()
            work = self.reference_work(inputs)
            peak_flops, peak_bw, source = roofline.choose_peaks(facts, work["precision"])
            if not peak_bw or not self.rec.candidate_ms:
                self.facts["physics"] = "no bandwidth peak known for this device: not checked"
                return
            r = roofline.compute(
                0, work["output_bytes"], self.rec.candidate_ms, peak_bw, peak_flops, source, work["precision"]
            )
            self.facts["physics"] = {
                "floor_ms": r.floor_ms,
                "fraction_of_floor": r.fraction_of_floor,
                "peak_source": source,
                # the output bytes from the judge's cache, or counted here (and what the count took)
                "reference_work": "cached"
                if work.get("cached")
                else {"count_s": work.get("count_s"), "counter_warm": work.get("counter_warm")},
            }
            if not peaks_hold(self.rec.reference_ms, r.floor_ms):
                # the reference itself beat the floor: the peaks are no ceiling (a measurement taken on
                # a loaded machine, a wrong datasheet): nothing is flagged, and a measured peak is
                # measured again by the next evaluation
                self.facts["physics"] = (
                    f"not checked: the reference ran in {self.rec.reference_ms:.4g} ms, under the floor of "
                    f"{r.floor_ms:.4g} ms the peaks ({source}) give"
                )
                if source == "measured":
                    gpu_facts.forget_measured(self.device, self.cfg.cache_dir)
                return
            margin = self.cfg.timing.physics_margin
            if self.rec.candidate_ms < margin * r.floor_ms:
                self.flag(
                    "faster_than_hardware",
                    f"the judge measured {self.rec.candidate_ms:.4g} ms a call, under "
                    f"{margin:g} x the roofline floor of {r.floor_ms:.4g} ms "
                    f"(its outputs' {work['output_bytes']} bytes at the peak bandwidth, {source}): no kernel "
                    "writes its outputs that fast, so the timer was forged; the speed-up is not trusted",
                )
        except Exception as exc:
            self.facts["physics"] = f"not checked: {type(exc).__name__}: {str(exc)[:200]}"


def peaks_hold(reference_ms: float | None, floor_ms: float) -> bool:
    """Are the peaks a ceiling? Not when the reference, timed by the judge, ran faster than the
    floor they give: then no candidate can be judged against them."""
    return reference_ms is None or reference_ms >= floor_ms


def turn_said(turn: GpuTurn) -> str:
    """How a turn had the GPU, in a few words: 'held' (at once), 'held after N s', or why not."""
    if turn.why_none:
        return f"none: {turn.why_none}"
    if not turn.held:
        return f"not had within {turn.wait_s:g} s"
    return "held" if turn.waited_s < 0.01 else f"held after {turn.waited_s:.3g} s"
