"""The judge: computes the reference, the float64 oracle and the verdict; never imports candidate code.

`python -m kernelwright.engine.child.judge JOB.json` (or `--spare JOB.json`). It loads the
problem, constructs the reference for the evaluation's seed, and then follows the runner's
reports as the parent forwards them on stdin (`{"cmd": "runner", "msg": {...}}`), reading the
candidate's outputs from the runner's files as plain data (`wire.read_tree`: exact tensors,
checked sizes, no code). Everything the runner says is a claim: outputs are judged against the
judge's own reference on its own inputs; facts the runner reports (patched functions, kernels,
threads, timings) can only be turned into flags, never into a pass. The judge asks the parent
to let the runner proceed (`time`), to ablate (`ablate T`) or to stop it, and sends the one
typed record (`EvalResult`) at the end. Imports only torch, the standard library and `core`.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import faulthandler  # noqa: E402
import json
import os
import sys
import traceback
from typing import Any

import torch

from kernelwright.core.record import CompileIssue, EvalResult, Stage, Status
from kernelwright.engine.child import device_handoff, heap
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.judge_state import (
    STAGE_KEY,
    HandoffUnavailable,
    ReferenceFailure,
    num,
    plain_data,
    short_tb,
    text,
)
from kernelwright.engine.child.judge_trials import JudgeTrials
from kernelwright.engine.child.problem_io import ProblemIO, load_source, torch_device
from kernelwright.engine.child.timing import probe
from kernelwright.engine.child.timing.window_plan import out_of_memory
from kernelwright.engine.child.verdict import Facts, decide

__all__ = ["HandoffUnavailable", "Judge", "ReferenceFailure", "failure_message", "main"]

# Looked up with whatever value the runner sent (any JSON value): keyed by object.
_FAILURE_STATUSES: dict[object, Status] = {
    "compile_error": Status.COMPILE_ERROR,
    "runtime_error": Status.RUNTIME_ERROR,
    "format_error": Status.FORMAT_ERROR,
    "engine_error": Status.ENGINE_ERROR,
}
_STAGES: dict[object, Stage] = {s.value: s for s in Stage}


def give_back_startup_memory() -> None:
    """What the start-up's device calls left in the caching allocator (cuBLAS's workspaces, the
    self-tests' blocks) given back before the reference's weights and inputs are made, so that
    those start where a plain process's would. A plain process that made the judge's start-up calls
    first ran level1/70's reference (a cuDNN transposed convolution) at 1.222 ms a call, 1.178 with
    them given back, 1.183 without the calls (H200, benchmarks/first_call_draws.py `judge_first`,
    `judge_first_released`). The workspaces come back at the next matmul."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


class Judge(JudgeTrials):
    """The judge's stages, in the order they come: start-up (trusted code only), the problem,
    the runner's reports (each to its handler below; the checks, timing, evidence and other sizes
    in `judge_trials`), and the final record (`finish`)."""

    # ---- set-up (trusted code only) -------------------------------------------------------------
    def startup(self) -> None:
        self.device = torch_device(self.cfg.device)
        if self.device.type == "cuda":
            if self.cfg.timing.probe:  # its start-up (a second CUDA context) overlaps this one's and the runner's build
                probe.start(self.device)
            for dtype in (torch.float32, torch.float64):  # the context and cuBLAS's handles, before any job comes
                x = torch.ones(8, 8, device=self.device, dtype=dtype)
                (x @ x).sum().item()
            if self.handoff is not None:  # the driver's calls for the runner's device outputs, loaded now
                self.handoff_self_test = device_handoff.self_test(self.device)
            self.measure_anchor()  # (in the GPU's turn: judge_timing.JudgeTiming.measure_anchor)
            give_back_startup_memory()
        self.started = True

    def load_problem(self) -> bool:
        try:
            self.problem = load_source(self.job.problem_source, self.job.problem_name, "kw_problem")
            self.io = ProblemIO(
                self.problem, self.device, self.cfg.inputs_on_device, self.rec.metadata, self.cfg.model_mode
            )
            self.ref_model = self.io.construct(self.problem.Model, self.cfg.seed)
            torch.manual_seed(self.cfg.seed)
            self.init_inputs = self.problem.get_init_inputs()
        except Exception as exc:
            self.set_verdict(
                Status.RUNTIME_ERROR,
                "The reference problem failed to load or construct:\n" + short_tb(exc),
                Stage.REFERENCE,
            )
            return False
        return True

    # ---- the runner's reports ------------------------------------------------------------------------
    def on_runner(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if not isinstance(kind, str):
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            return
        t0 = time.perf_counter()
        try:
            handler(self, msg)
        except ReferenceFailure as exc:  # the problem's own fault
            self.set_verdict(Status.RUNTIME_ERROR, "The reference Model failed to run:\n" + exc.log, Stage.REFERENCE)
            self.ask("stop")
        finally:  # the judge's own time per kind of report (metadata["judge_busy_s"])
            self.busy_s[kind] = self.busy_s.get(kind, 0.0) + time.perf_counter() - t0

    def r_prestarted(self, msg: dict[str, Any]) -> None:
        self.rec.metadata["prestarted"] = {"idle_s": num(msg.get("idle_s")), "startup_s": num(msg.get("startup_s"))}

    def r_stage(self, msg: dict[str, Any]) -> None:
        stage = msg.get("stage")
        if isinstance(stage, str) and stage in STAGE_KEY:
            self.enter_stage(stage)

    def r_startup(self, msg: dict[str, Any]) -> None:
        self.rec.device = text(msg.get("device"), 200)
        self.rec.device_type = self.device.type
        self.rec.stage_times.startup_s = num(msg.get("startup_s"))
        self.rec.metadata.update(
            torch_version=text(msg.get("torch_version"), 50),
            cuda_version=text(msg.get("cuda_version"), 50),
            python=text(msg.get("python"), 50),
        )

    def r_build(self, msg: dict[str, Any]) -> None:
        self.rec.metadata["builds"] = plain_data(msg.get("builds") or [])

    def r_failure(self, msg: dict[str, Any]) -> None:
        status = _FAILURE_STATUSES.get(msg.get("status"), Status.RUNTIME_ERROR)
        if msg.get("caught") is True:
            self.rec.metadata["build_failure_caught"] = True
        if isinstance(msg.get("engine_traceback"), str):
            self.rec.metadata["engine_traceback"] = text(msg["engine_traceback"])
        stage = _STAGES.get(msg.get("stage"), None)
        issues = []
        for i in (msg.get("compile_issues") or [])[:50]:
            if isinstance(i, dict):
                try:
                    issues.append(
                        CompileIssue(
                            **{k: plain_data(v) for k, v in i.items() if k in CompileIssue.__dataclass_fields__}
                        )
                    )
                except TypeError:
                    pass
        if issues:
            self.rec.compile_issues = issues
        self.set_verdict(status, text(msg.get("log")), stage)

    def r_done(self, msg: dict[str, Any]) -> None:
        self.done = True

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self, ended: dict[str, Any]) -> EvalResult:
        """The final record. `ended`: how the runner ended, as the parent saw it."""
        rec = self.rec
        self.close_stage()

        first = self.first_failure
        facts = Facts(
            trials=self.cfg.trials,
            reported=self.reported,
            first_wrong_trial=first if first is not None and any(not tr.passed for tr in rec.trials) else None,
            failed_trials=sum(1 for tr in rec.trials if not tr.passed),
            ablation_lines=tuple(self.ablation_lines),
            checks_passed=self.checks_passed,
            failed_guards=tuple((f, self.flags[f]) for f in self.failing_guards()),
            timing_expected=self.timing_asked and self.cfg.time_candidate,
            timed=rec.candidate_timing is not None,
            runner_timed_out_stage=ended.get("timed_out_stage") or None,
            runner_limit_s=float(ended.get("limit_s") or 0),
            runner_limit_kind="report" if ended.get("limit_kind") == "report" else "stage",
            protocol_violation=text(ended["protocol"]) if ended.get("protocol") else None,
            runner_finished=self.done,
            runner_ended_how=str(ended.get("how") or ""),
            runner_stage=str(ended.get("stage") or self.current_stage),
        )
        verdict = decide(facts)
        rec.status, rec.error_log, rec.error_stage = verdict.status, verdict.log, verdict.stage
        rec.correct = verdict.status is Status.PASSED
        if rec.status is not Status.PASSED:  # a figure of a candidate that did not pass is no speed-up
            rec.candidate_ms = rec.speedup = rec.speedup_vs_compile = None
        numeric = [tr for tr in rec.trials if tr.max_abs_err is not None]
        rec.max_abs_err = max((tr.max_abs_err for tr in rec.trials if tr.max_abs_err is not None), default=None)
        rec.mean_abs_err = (sum(tr.mean_abs_err or 0.0 for tr in numeric) / len(numeric)) if numeric else None
        self.degenerate_check()
        rec.metadata["guards"] = {
            "enabled": self.cfg.guards.enabled,
            "checked": list(dict.fromkeys(self.checked)),
            "flags": dict(self.flags),
            "failed": [f for f in self.flags if f in self.cfg.guards.fail_on],
            "fail_on": list(self.cfg.guards.fail_on),
            "nan_fill": self.cfg.guards.enabled and self.cfg.guards.nan_fill,
            "facts": self.facts,
        }
        rec.metadata["numerics"] = dict(self.numerics, oracle_error=self.oracle_error or None)
        rec.metadata["judged_by"] = "judge process (no candidate code)"
        if self.gpu_query is not None:  # evidence only (timing/gpu_load.py)
            rec.metadata["gpu_processes"] = dict(self.gpu_query.result(), judge_pid=os.getpid())
        if self.turn is not None:
            self.turn.check()
            rec.metadata["gpu_turn"] = self.turn.facts()
            self.turn.release()
        rec.metadata["judge_busy_s"] = {k: round(v, 4) for k, v in self.busy_s.items() if v >= 0.001}
        if self.handoff is not None:
            rec.metadata["judge_busy_s"]["device_handoff"] = round(self.handoff_s, 4)
            if self.handoff_self_test:
                rec.metadata["device_handoff_judge_self_test"] = self.handoff_self_test
            if self.device_clock_off:
                rec.metadata["device_clock_off"] = self.device_clock_off
        return rec


# The runner's reports the judge reads, by kind: everything else is ignored.
_HANDLERS = {
    "prestarted": Judge.r_prestarted,
    "stage": Judge.r_stage,
    "startup": Judge.r_startup,
    "build": Judge.r_build,
    "compiled": Judge.r_compiled,
    "failure": Judge.r_failure,
    "call_error": Judge.r_call_error,
    "output": Judge.r_output,
    "ablation": Judge.r_ablation,
    "patched": Judge.r_patched,
    "guards": Judge.r_guards,
    "evidence": Judge.r_evidence,
    "done": Judge.r_done,
}


def main(argv: list[str] | None = None) -> int:
    """`judge.py DEVICE [--spare] FD`. The job comes as the first line on stdin (never from a file
    the runner could reach), commands after it, one JSON object per line; the record goes to FD."""
    argv = sys.argv[1:] if argv is None else argv
    faulthandler.enable()
    heap.keep_freed_memory()  # as the other side does: a timed window's outputs reuse the heap
    heap.keep_tunables_to_itself()
    spare = "--spare" in argv
    handoff = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--handoff=")]
    device, fd = [a for a in argv if a != "--spare" and not a.startswith("--handoff=")][-2:]
    chan = Channel(int(fd))
    judge = Judge({"config": {"device": device}}, chan, handoff[0] if handoff else None)
    try:
        judge.startup()
    except Exception:
        traceback.print_exc()
        os._exit(3)
    if spare:
        chan.send("ready")
    if judge.device.type == "cuda":  # (on the CPU the check runs beside no GPU work: left where it is)
        judge.warm_in_background()
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    try:
        judge.take(json.loads(line))
        loaded = judge.load_problem()
        chan.send("loaded", ok=loaded)
        if loaded and judge.device.type != "cuda":
            judge.warm_if_uncounted()
        if not loaded:
            judge.ask("stop")
        ended: dict[str, Any] = {}
        handled = 0
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("cmd") == "runner":
                if loaded:
                    judge.on_runner(cmd.get("msg") or {})
                handled += 1
                chan.send("handled", n=handled)  # the parent's clocks of the runner go on (engine/coordinator.py)
            elif cmd.get("cmd") == "ended":
                ended = cmd
                break
        rec = judge.finish(judge.shapes_ended(ended))
    except Exception as exc:  # the judge's own failure: never the candidate's, never a pass
        rec = judge.rec
        rec.status, rec.correct = Status.ENGINE_ERROR, False
        rec.error_log = failure_message(exc)
        rec.metadata["engine_traceback"] = short_tb(exc)
        rec.candidate_ms = rec.speedup = rec.speedup_vs_compile = None
    chan.send("final", record=rec.to_dict())
    sys.stdout.flush()
    os._exit(0)


def failure_message(exc: BaseException) -> str:
    """The record's error for the judge's own failure: never the candidate's fault; where the device
    or the host refused the judge's own memory (other processes on the device held it), what to do."""
    what = f"{type(exc).__name__}: {str(exc)[:300]}"
    if out_of_memory(exc):
        return (
            "The judge ran out of memory for its own buffers, not the candidate's fault (other processes "
            "on the device held it, or the problem's inputs are too large for a timing window): run fewer "
            "evaluations on this device at once, or set a smaller `window_budget_mb` under [eval.timing] "
            "in kernelwright.toml; " + what
        )
    return f"The engine's judge failed (an engine bug, not the candidate's fault): {what}"


if __name__ == "__main__":
    main()
