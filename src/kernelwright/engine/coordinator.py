"""One evaluation, seen from the parent: the runner produces, the judge decides, the parent keeps time.

The parent routes the runner's reports to the judge and the judge's requests (`time`, `ablate T`,
`stop`) back to the runner, and applies its own schedule of deadlines: the runner's stages are
accepted once each and in order (startup, build, init, correctness, timing, profile), each with
its budget from the moment it is announced, all within a hard total of the budgets' sum from the
runner's spawn, so no message can extend an evaluation. The judge (trusted) may also set a limit
between two of the runner's reports in a stage (`limit`: in correctness, from the reference's own
time), which only ever ends a stage sooner. Before the first report of that stage, the judge's JIT allowance
(`first_extra_s`) holds only while a compile is seen running (engine/compile_watch.py: a compiler at
work in the runner's tree, its JIT caches growing), up to StageTimeouts.jit_allowance past the last
report; a candidate that compiles in its own process, out of sight (torch.compile's tracing), keeps
the allowance whole. The runner's clocks (its stage's budget, the limit
between its reports) stop while the judge works on a report the parent handed it, until the judge
says it has handled every one (`handled`): a runner waiting for the judge (its reference, its
oracle, the inputs of the next timing window) is not the candidate being slow; the hard total
still holds, and the judge's own deadlines hold inside its timing windows. A line longer than
1 MiB, or more messages than any honest run sends, ends the runner (a protocol violation). The
one record returned is the judge's; the parent only says how the runner ended.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelwright.core.config import StageTimeouts
from kernelwright.engine.compile_watch import CompileWatch
from kernelwright.engine.process import Child, describe_signal, kill_group

STAGE_ORDER = ("startup", "build", "init", "correctness", "timing", "profile")
MAX_RUNNER_MESSAGES = 2000
JUDGE_FINISH_S = 120.0  # the judge's last word after the runner ended (reads the last files)


@dataclass
class Outcome:
    record: dict[str, Any] | None  # the judge's final record (None: the judge failed)
    runner_exit: int | None
    runner_log: str
    judge_log: str
    judge_problem: str  # why the judge gave no record, when it did not
    wall_s: float
    judge_tail_s: float = 0.0  # from the runner's end to the judge's record (the verdict's own time)
    runner_clocks_paused_s: float = 0.0  # while the runner lived, the judge at work on its reports
    # each stage the runner entered: [start, end] in seconds since the epoch (StageTimes.spans)
    spans: dict[str, list[float]] = field(default_factory=dict)
    compile_seen: list[str] = field(default_factory=list)  # what the compile watch saw at work, once each


class _Outbox:
    """Lines for a child's stdin, written without ever blocking the parent."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.buf = bytearray()
        self.fd = child.proc.stdin.fileno() if child.proc.stdin is not None else -1
        if self.fd >= 0:
            os.set_blocking(self.fd, False)

    def put(self, obj: Any) -> None:
        self.buf += (json.dumps(obj) if not isinstance(obj, str) else obj).encode() + b"\n"
        self.flush()

    def flush(self) -> None:
        while self.buf and self.fd >= 0:
            try:
                n = os.write(self.fd, self.buf)
            except BlockingIOError:
                return
            except OSError:
                self.buf.clear()
                self.fd = -1
                return
            del self.buf[:n]


def coordinate(
    runner: Child,
    judge: Child,
    judge_job: dict[str, Any],
    timeouts: StageTimeouts,
    on_stage: Callable[[str], None] | None = None,
    exit_code_of: Callable[[int | None], int | None] = lambda c: c,
    watch: CompileWatch | None = None,
    jit_out_of_sight: bool = False,
) -> Outcome:
    """Run one evaluation to the judge's record. `exit_code_of` maps the runner's exit code as the
    sandbox reports it (bubblewrap: 128 + N for a signal) back to Popen's convention. `watch`: what
    tells a compile at work (none: the JIT allowance is never granted); `jit_out_of_sight`: the
    candidate compiles in its own process (torch.compile), the allowance is granted whole."""
    t_start = time.monotonic()
    run = _Coordination(runner, judge, judge_job, timeouts, on_stage, watch, jit_out_of_sight)
    run.follow_runner()
    run.drain_runner()
    run.end_runner(exit_code_of)
    t_ended = time.monotonic()
    spans = stage_spans(run.stage_began, t_ended)
    problem = run.await_record()
    judge_tail_s = time.monotonic() - t_ended
    judge_log = judge.log_tail()
    judge.stop()
    return Outcome(
        record=run.record if isinstance(run.record, dict) else None,
        runner_exit=run.exit_code,
        runner_log=run.runner_log,
        judge_log=judge_log,
        judge_problem=problem,
        wall_s=time.monotonic() - t_start,
        judge_tail_s=judge_tail_s,
        runner_clocks_paused_s=run.judge_busy_s,
        spans=spans,
        compile_seen=list(watch.seen) if watch is not None else [],
    )


def stage_spans(began: dict[str, float], ended: float) -> dict[str, list[float]]:
    """Each stage's [start, end] on the wall clock, from when it began (monotonic) to when the next
    one began or the runner ended."""
    to_wall = time.time() - time.monotonic()
    order = sorted(began.items(), key=lambda kv: kv[1])
    spans: dict[str, list[float]] = {}
    for (stage, start), nxt in zip(order, [*order[1:], ("", ended)], strict=True):
        spans[stage] = [round(start + to_wall, 3), round(max(start, nxt[1]) + to_wall, 3)]
    return spans


class _Coordination:
    """One evaluation's routing and clocks, step by step: `follow_runner` while it lives,
    `drain_runner` and `end_runner` as it ends, `await_record` for the judge's word."""

    def __init__(
        self,
        runner: Child,
        judge: Child,
        judge_job: dict[str, Any],
        timeouts: StageTimeouts,
        on_stage: Callable[[str], None] | None,
        watch: CompileWatch | None = None,
        jit_out_of_sight: bool = False,
    ) -> None:
        self.runner, self.judge, self.on_stage = runner, judge, on_stage
        self.watch, self.jit_out_of_sight = watch, jit_out_of_sight
        self.jit_cap = float(timeouts.jit_allowance)
        self.to_judge = _Outbox(judge)
        self.to_runner = _Outbox(runner)
        self.to_judge.put(judge_job)
        self.budgets = {s: float(getattr(timeouts, s)) for s in STAGE_ORDER}
        self.hard_deadline = runner.started + sum(self.budgets.values())
        self.stage = "startup"
        self.deadline = runner.started + self.budgets["startup"]
        self.stage_began = {self.stage: runner.started}
        if on_stage:
            on_stage(self.stage)
        self.runner_open = True
        self.asked_stop = False
        self.protocol = ""
        self.timed_out = ""
        self.n_msgs = 0
        self.record: dict[str, Any] | None = None
        self.judge_gone = False
        self.pending = list(runner.pending)
        runner.pending = []
        # the judge's per-report limits: stage -> (the most seconds between two of the runner's reports
        # in that stage, extra seconds before its first one); the stage's flat budget still holds
        self.report_limits: dict[str, tuple[float, float]] = {}
        self.last_report = time.monotonic()
        self.reported_in_stage = False
        self.limit_hit = 0.0  # the limit that ended the runner (seconds), when it was one of those
        # the judge at work on the runner's reports: how many were handed to it and how many it has
        # handled, and since when it has had one in hand (the runner's clocks stop meanwhile)
        self.forwarded = self.handled = 0
        self.judge_busy_since: float | None = None
        self.judge_busy_s = 0.0
        self.exit_code: int | None = None
        self.runner_log = ""

    def resume_clocks(self, now: float) -> None:
        """The judge has caught up: the runner's clocks go on, the judge's time added to them."""
        if self.judge_busy_since is None:
            return
        busy_from, self.judge_busy_since = self.judge_busy_since, None
        self.judge_busy_s += now - busy_from
        # each clock stood still from the later of the judge's start and its own start
        self.deadline += now - max(busy_from, self.stage_began[self.stage])
        self.last_report += now - max(busy_from, self.last_report)

    def forward(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        now = time.monotonic()
        self.last_report = now
        if kind != "stage":
            self.reported_in_stage = True
        if kind == "stage":
            new = msg.get("stage")
            if new in STAGE_ORDER and STAGE_ORDER.index(new) > STAGE_ORDER.index(self.stage):
                self.stage = new
                self.stage_began[self.stage] = now
                self.reported_in_stage = False  # the JIT allowance: before the first report of a stage, once
                self.deadline = now + self.budgets[self.stage]
                if self.on_stage:
                    self.on_stage(self.stage)
            else:
                return  # a stage once announced, or out of order: not a new deadline
        if kind == "timing" and "timing" in self.stage_began:
            msg["parent_stage_s"] = now - self.stage_began["timing"]  # the parent's clock, not the runner's
        self.to_judge.put({"cmd": "runner", "msg": msg})
        self.forwarded += 1
        if self.judge_busy_since is None:
            self.judge_busy_since = now

    # ---- while the runner lives -------------------------------------------------------------------

    def follow_runner(self) -> None:
        for msg in self.pending:
            self.forward(msg)
        while self.runner_open and self._step():
            pass
        # the judge's last report in hand when following ended (it asked `stop` from inside its
        # handler, before its `handled` came): its time so far counts, whichever line came first
        self.resume_clocks(time.monotonic())

    def _limit(self) -> tuple[float, float]:
        """The runner's next deadline, and the limit between its reports that sets it (0: none)."""
        limit = min(self.deadline, self.hard_deadline)
        per_report = 0.0
        if self.stage in self.report_limits:
            between, first = self.report_limits[self.stage]
            per_report = between + (0.0 if self.reported_in_stage else self._jit_extra(first))
            limit = min(limit, self.last_report + per_report)
        if self.judge_busy_since is not None:  # the runner's clocks stand still: the judge's total only
            limit, per_report = self.hard_deadline, 0.0
        return limit, per_report

    def _jit_extra(self, first: float) -> float:
        """The JIT allowance before a stage's first report: whole where the compile is out of sight
        (and the judge grants one); else up to the last time a compile was seen, at most the cap."""
        if self.jit_out_of_sight:
            return first
        seen = self.watch.look() if self.watch is not None else None
        if seen is None or seen <= self.last_report:
            return 0.0
        return min(seen - self.last_report, max(first, self.jit_cap))

    def _step(self) -> bool:
        """One wait on both pipes; False when following the runner must stop (a deadline, a
        protocol violation, the judge gone)."""
        now = time.monotonic()
        limit, per_report = self._limit()
        if now >= limit:
            self.timed_out = self.stage
            if per_report and limit == self.last_report + per_report:
                self.limit_hit = per_report
            return False
        runner, judge = self.runner, self.judge
        fds = [runner.read_fd] + ([judge.read_fd] if not self.judge_gone else [])
        wlist = [self.to_judge.fd] if self.to_judge.buf and self.to_judge.fd >= 0 else []
        ready, writable, _ = select.select(fds, wlist, [], min(limit - now, 0.5))
        if writable:
            self.to_judge.flush()
        if runner.read_fd in ready and not self._read_runner():
            return False
        if not self.judge_gone and judge.read_fd in ready and not self._read_judge():
            return False
        if not ready and not runner.alive():
            self.runner_open = False  # gone; a grandchild may still hold the pipe open
        return True

    def _read_runner(self) -> bool:
        """The runner's reports, forwarded; False on a protocol violation (a flood)."""
        chunk = os.read(self.runner.read_fd, 1 << 16)
        if not chunk:
            self.runner_open = False
        for msg in self.runner.reader.feed(chunk):
            self.n_msgs += 1
            if self.n_msgs > MAX_RUNNER_MESSAGES:
                self.protocol = (
                    f"the evaluation process sent more than {MAX_RUNNER_MESSAGES} reports (a flood); it was stopped"
                )
                break
            self.forward(msg)
        if self.runner.reader.overflow:
            self.protocol = "the evaluation process wrote a report line over 1 MiB (a flood); it was stopped"
        return not self.protocol

    def _read_judge(self) -> bool:
        """The judge's requests and words; False when its pipe has closed."""
        chunk = os.read(self.judge.read_fd, 1 << 16)
        if not chunk:
            self.judge_gone = True
            return False
        for msg in self.judge.reader.feed(chunk):
            self._from_judge(msg)
        return True

    def _from_judge(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "ask":
            what = str(msg.get("what", ""))
            self.to_runner.put(what)
            if what == "stop":
                self.runner_open = False
                self.asked_stop = True
        elif msg.get("type") == "limit":  # the judge's limit between reports (from the reference's time)
            st, secs, first = msg.get("stage"), msg.get("s"), msg.get("first_extra_s", 0.0)
            if (
                st in self.budgets
                and isinstance(secs, (int, float))
                and secs > 0
                and isinstance(first, (int, float))
                and first >= 0
            ):
                self.report_limits[st] = (float(secs), float(first))
        elif msg.get("type") == "handled":  # the judge has handled this many of the runner's reports
            n = msg.get("n")
            if isinstance(n, int) and not isinstance(n, bool):
                self.handled = max(self.handled, n)
                if self.handled >= self.forwarded:
                    self.resume_clocks(time.monotonic())
        elif msg.get("type") == "final":
            self.record = msg.get("record")

    # ---- the runner has ended (or must end now) ---------------------------------------------------

    def drain_runner(self) -> None:
        """A grace to exit for a runner that was told to stop or closed its pipe, and the last
        reports still in the pipe."""
        runner = self.runner
        if not self.runner_open and not self.timed_out and not self.protocol and runner.alive():
            # it was told to stop, or closed its pipe: a short grace to exit by itself
            end = time.monotonic() + 2.0
            while runner.alive() and time.monotonic() < end:
                msgs, eof = runner.read_messages(0.1)
                for msg in msgs:
                    self.forward(msg)
                if eof:
                    try:
                        runner.proc.wait(timeout=max(0.0, end - time.monotonic()))
                    except Exception:
                        pass
                    break
        # the last reports still in the pipe
        if runner.read_fd >= 0 and not self.protocol:
            while True:
                msgs, eof = runner.read_messages(0.0)
                for msg in msgs:
                    self.n_msgs += 1
                    if self.n_msgs <= MAX_RUNNER_MESSAGES:
                        self.forward(msg)
                if eof or not msgs:
                    break
        if not self.timed_out and not self.protocol and not self.asked_stop:
            try:  # it closed its pipe: let it finish exiting, so that its exit code is its own
                runner.proc.wait(timeout=5)
            except Exception:
                pass

    def end_runner(self, exit_code_of: Callable[[int | None], int | None]) -> None:
        """The runner's group killed, its exit code and log kept, and the judge told how it ended."""
        runner = self.runner
        stopped_by_judge = self.asked_stop and not self.timed_out and not self.protocol
        exit_code = None
        try:
            kill_group(runner.proc)  # anything it left in its group
            try:
                exit_code = runner.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self.runner_log = runner.log_tail()
        finally:
            runner.stop()
        self.exit_code = exit_code_of(exit_code)
        how = "" if stopped_by_judge else describe_signal(self.exit_code)
        self.to_judge.put(
            {
                "cmd": "ended",
                "stage": self.stage,
                "timed_out_stage": self.timed_out or None,
                "limit_s": self.limit_hit or self.budgets.get(self.timed_out, 0.0),
                "limit_kind": "report" if self.limit_hit else "stage",
                "exit_code": self.exit_code,
                "how": how,
                "protocol": self.protocol or None,
                "log_tail": self.runner_log[-4000:],
            }
        )

    # ---- the judge's record ------------------------------------------------------------------------

    def await_record(self) -> str:
        """Waits for the judge's record; the problem when none came ("" when one did)."""
        end = time.monotonic() + JUDGE_FINISH_S
        while self.record is None and not self.judge_gone:
            self.to_judge.flush()
            left = end - time.monotonic()
            if left <= 0:
                return f"the judge gave no record within {JUDGE_FINISH_S:g} s of the runner's end"
            msgs, eof = self.judge.read_messages(min(left, 0.5))
            for msg in msgs:
                if msg.get("type") == "final":
                    self.record = msg.get("record")
            if eof:
                self.judge_gone = True
        if self.record is None:
            return f"the judge {describe_signal(self.judge.proc.poll())} without a record"
        return ""
