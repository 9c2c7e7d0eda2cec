"""One evaluation, seen from the parent: the runner produces, the judge decides, the parent keeps time.

The parent routes the runner's reports to the judge and the judge's requests (`time`, `ablate T`,
`stop`) back to the runner, and applies its own schedule of deadlines: the runner's stages are
accepted once each and in order (startup, build, init, correctness, timing, profile), each with
its budget from the moment it is announced, all within a hard total of the budgets' sum from the
runner's spawn, so no message can extend an evaluation. The judge (trusted) may also set a limit
between two of the runner's reports in a stage (`limit`: in correctness, from the reference's own
time), which only ever ends a stage sooner. The runner's clocks (its stage's budget, the limit
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelwright.core.config import StageTimeouts
from kernelwright.engine.process import Child, describe_signal

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
) -> Outcome:
    """Run one evaluation to the judge's record. `exit_code_of` maps the runner's exit code as the
    sandbox reports it (bubblewrap: 128 + N for a signal) back to Popen's convention."""
    t_start = time.monotonic()
    to_judge = _Outbox(judge)
    to_runner = _Outbox(runner)
    to_judge.put(judge_job)
    budgets = {s: float(getattr(timeouts, s)) for s in STAGE_ORDER}
    hard_deadline = runner.started + sum(budgets.values())
    stage = "startup"
    deadline = runner.started + budgets["startup"]
    stage_began = {stage: runner.started}
    if on_stage:
        on_stage(stage)
    runner_open = True
    asked_stop = False
    protocol = ""
    timed_out = ""
    n_msgs = 0
    record: dict[str, Any] | None = None
    judge_gone = False
    pending = list(runner.pending)
    runner.pending = []

    # the judge's per-report limits: stage -> (the most seconds between two of the runner's reports
    # in that stage, extra seconds before its first one); the stage's flat budget still holds
    report_limits: dict[str, tuple[float, float]] = {}
    last_report = time.monotonic()
    reported_in_stage = False
    limit_hit = 0.0  # the limit that ended the runner (seconds), when it was one of those
    # the judge at work on the runner's reports: how many were handed to it and how many it has
    # handled, and since when it has had one in hand (the runner's clocks stop meanwhile)
    forwarded = handled = 0
    judge_busy_since: float | None = None
    judge_busy_s = 0.0

    def resume_clocks(now: float) -> None:
        """The judge has caught up: the runner's clocks go on, the judge's time added to them."""
        nonlocal deadline, last_report, judge_busy_since, judge_busy_s
        if judge_busy_since is None:
            return
        busy_from, judge_busy_since = judge_busy_since, None
        judge_busy_s += now - busy_from
        # each clock stood still from the later of the judge's start and its own start
        deadline += now - max(busy_from, stage_began[stage])
        last_report += now - max(busy_from, last_report)

    def forward(msg: dict[str, Any]) -> None:
        nonlocal stage, deadline, last_report, reported_in_stage, forwarded, judge_busy_since
        kind = msg.get("type")
        now = time.monotonic()
        last_report = now
        if kind != "stage":
            reported_in_stage = True
        if kind == "stage":
            new = msg.get("stage")
            if new in STAGE_ORDER and STAGE_ORDER.index(new) > STAGE_ORDER.index(stage):
                stage = new
                stage_began[stage] = now
                reported_in_stage = False  # the JIT allowance: before the first report of a stage, once
                deadline = now + budgets[stage]
                if on_stage:
                    on_stage(stage)
            else:
                return  # a stage once announced, or out of order: not a new deadline
        if kind == "timing" and "timing" in stage_began:
            msg["parent_stage_s"] = now - stage_began["timing"]  # the parent's clock, not the runner's
        to_judge.put({"cmd": "runner", "msg": msg})
        forwarded += 1
        if judge_busy_since is None:
            judge_busy_since = now

    for msg in pending:
        forward(msg)
    # ---- while the runner lives -------------------------------------------------------------------
    while runner_open:
        now = time.monotonic()
        limit = min(deadline, hard_deadline)
        per_report = 0.0
        if stage in report_limits:
            between, first = report_limits[stage]
            per_report = between + (0.0 if reported_in_stage else first)
            limit = min(limit, last_report + per_report)
        if judge_busy_since is not None:  # the runner's clocks stand still: the judge's total only
            limit, per_report = hard_deadline, 0.0
        if now >= limit:
            timed_out = stage
            if per_report and limit == last_report + per_report:
                limit_hit = per_report
            break
        fds = [runner.read_fd] + ([judge.read_fd] if not judge_gone else [])
        import select

        wlist = [to_judge.fd] if to_judge.buf and to_judge.fd >= 0 else []
        ready, writable, _ = select.select(fds, wlist, [], min(limit - now, 0.5))
        if writable:
            to_judge.flush()
        if runner.read_fd in ready:
            chunk = os.read(runner.read_fd, 1 << 16)
            if not chunk:
                runner_open = False
            for msg in runner.reader.feed(chunk):
                n_msgs += 1
                if n_msgs > MAX_RUNNER_MESSAGES:
                    protocol = (
                        f"the evaluation process sent more than {MAX_RUNNER_MESSAGES} reports (a flood); it was stopped"
                    )
                    break
                forward(msg)
            if runner.reader.overflow:
                protocol = "the evaluation process wrote a report line over 1 MiB (a flood); it was stopped"
            if protocol:
                break
        if not judge_gone and judge.read_fd in ready:
            chunk = os.read(judge.read_fd, 1 << 16)
            if not chunk:
                judge_gone = True
                break
            for msg in judge.reader.feed(chunk):
                if msg.get("type") == "ask":
                    what = str(msg.get("what", ""))
                    to_runner.put(what)
                    if what == "stop":
                        runner_open = False
                        asked_stop = True
                elif msg.get("type") == "limit":  # the judge's limit between reports (from the reference's time)
                    st, secs, first = msg.get("stage"), msg.get("s"), msg.get("first_extra_s", 0.0)
                    if (
                        st in budgets
                        and isinstance(secs, (int, float))
                        and secs > 0
                        and isinstance(first, (int, float))
                        and first >= 0
                    ):
                        report_limits[st] = (float(secs), float(first))
                elif msg.get("type") == "handled":  # the judge has handled this many of the runner's reports
                    n = msg.get("n")
                    if isinstance(n, int) and not isinstance(n, bool):
                        handled = max(handled, n)
                        if handled >= forwarded:
                            resume_clocks(time.monotonic())
                elif msg.get("type") == "final":
                    record = msg.get("record")
        if not ready and not runner.alive():
            runner_open = False  # gone; a grandchild may still hold the pipe open
    # ---- the runner has ended (or must end now) ---------------------------------------------------
    if not runner_open and not timed_out and not protocol and runner.alive():
        # it was told to stop, or closed its pipe: a short grace to exit by itself
        end = time.monotonic() + 2.0
        while runner.alive() and time.monotonic() < end:
            msgs, eof = runner.read_messages(0.1)
            for msg in msgs:
                forward(msg)
            if eof:
                try:
                    runner.proc.wait(timeout=max(0.0, end - time.monotonic()))
                except Exception:
                    pass
                break
    # the last reports still in the pipe
    if runner.read_fd >= 0 and not protocol:
        while True:
            msgs, eof = runner.read_messages(0.0)
            for msg in msgs:
                n_msgs += 1
                if n_msgs <= MAX_RUNNER_MESSAGES:
                    forward(msg)
            if eof or not msgs:
                break
    if not timed_out and not protocol and not asked_stop:
        try:  # it closed its pipe: let it finish exiting, so that its exit code is its own
            runner.proc.wait(timeout=5)
        except Exception:
            pass
    stopped_by_judge = asked_stop and not timed_out and not protocol
    runner_log = ""
    exit_code = None
    try:
        import subprocess as _sp

        from kernelwright.engine.process import kill_group

        kill_group(runner.proc)  # anything it left in its group
        try:
            exit_code = runner.proc.wait(timeout=30)
        except _sp.TimeoutExpired:
            pass
        runner_log = runner.log_tail()
    finally:
        runner.stop()
    exit_code = exit_code_of(exit_code)
    how = "" if stopped_by_judge else describe_signal(exit_code)
    ended = {
        "cmd": "ended",
        "stage": stage,
        "timed_out_stage": timed_out or None,
        "limit_s": limit_hit or budgets.get(timed_out, 0.0),
        "limit_kind": "report" if limit_hit else "stage",
        "exit_code": exit_code,
        "how": how,
        "protocol": protocol or None,
        "log_tail": runner_log[-4000:],
    }
    to_judge.put(ended)
    # ---- the judge's record ------------------------------------------------------------------------
    t_ended = time.monotonic()
    end = t_ended + JUDGE_FINISH_S
    problem = ""
    while record is None and not judge_gone:
        to_judge.flush()
        left = end - time.monotonic()
        if left <= 0:
            problem = f"the judge gave no record within {JUDGE_FINISH_S:g} s of the runner's end"
            break
        msgs, eof = judge.read_messages(min(left, 0.5))
        for msg in msgs:
            if msg.get("type") == "final":
                record = msg.get("record")
        if eof:
            judge_gone = True
    if record is None and not problem:
        problem = f"the judge {describe_signal(judge.proc.poll())} without a record"
    judge_tail_s = time.monotonic() - t_ended
    judge_log = judge.log_tail()
    judge.stop()
    return Outcome(
        record=record if isinstance(record, dict) else None,
        runner_exit=exit_code,
        runner_log=runner_log,
        judge_log=judge_log,
        judge_problem=problem,
        wall_s=time.monotonic() - t_start,
        judge_tail_s=judge_tail_s,
        runner_clocks_paused_s=judge_busy_s,
    )
