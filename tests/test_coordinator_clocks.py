"""The parent's clocks of the runner (engine/coordinator.py) on a synthetic clock: each stage's
budget from its announcement, the hard total from the spawn, the judge's limit between reports, and
the runner's clocks standing still while the judge works on a report it was handed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernelwright.core.config import StageTimeouts
from kernelwright.engine import coordinator

T0 = 1000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(coordinator.time, "monotonic", c)
    return c


def child() -> SimpleNamespace:
    return SimpleNamespace(started=T0, pending=[], proc=SimpleNamespace(stdin=None))  # stdin None: nothing sent


def coordination(stages: list[str] | None = None, **kw) -> coordinator._Coordination:
    timeouts = StageTimeouts(startup=10, build=20, init=5, correctness=30, timing=40, profile=50, jit_allowance=8)
    return coordinator._Coordination(child(), child(), {"job": 1}, timeouts, stages.append if stages else None, **kw)


class Watch:
    """A compile watch that saw a compile at work last at `last_seen` (None: never)."""

    def __init__(self) -> None:
        self.last_seen: float | None = None

    def look(self) -> float | None:
        return self.last_seen


def test_each_stage_has_its_budget_from_its_announcement_and_a_stage_never_restarts(clock):
    stages: list[str] = ["spawned"]
    c = coordination(stages)
    assert c._limit() == (T0 + 10, 0.0) and c.hard_deadline == T0 + 155
    clock.t = T0 + 4
    c.forward({"type": "stage", "stage": "build"})
    assert c.deadline == T0 + 4 + 20 and stages == ["spawned", "startup", "build"]
    for again in ("build", "startup", "nonsense"):  # announced already, out of order, unknown: no new budget
        clock.t += 3
        c.forward({"type": "stage", "stage": again})
        assert c.deadline == T0 + 24 and c.stage == "build"
    assert c.forwarded == 1  # only the announcement that moved the stage went to the judge


def test_the_runners_clocks_stand_still_while_the_judge_works_and_go_on_when_it_has_caught_up(clock):
    c = coordination()
    clock.t = T0 + 2
    c.forward({"type": "stage", "stage": "correctness"})  # budget 30 from T0 + 2
    c.forward({"type": "trial", "n": 0})
    assert c.judge_busy_since == T0 + 2
    assert c._limit() == (c.hard_deadline, 0.0)  # only the hard total holds meanwhile
    clock.t = T0 + 42  # the judge took 40 s (a slow reference): past the stage's own budget
    c._from_judge({"type": "handled", "n": 1})  # one of the two reports: not caught up
    assert c.judge_busy_since is not None
    c._from_judge({"type": "handled", "n": 2})
    assert c.judge_busy_since is None and c.judge_busy_s == pytest.approx(40)
    assert c._limit() == (pytest.approx(T0 + 72), 0.0)  # the 40 s added to the stage's budget


def test_the_judges_time_on_its_last_report_counts_when_it_asked_stop_before_saying_handled(clock):
    """The judge asks `stop` from inside its handler (after the timing stage), then sends `handled`.
    When `stop` arrives in a read of its own, following the runner ends there: the judge's time on
    that report still counts as the runner's clocks standing still (it read 0.008 s once, not 4 s)."""
    c = coordination()
    c.runner_open = False  # (no runner to follow: follow_runner only settles the clocks)
    clock.t = T0 + 2
    c.forward({"type": "output", "label": "guards"})  # the report whose handler runs the windows
    clock.t = T0 + 6
    c._from_judge({"type": "ask", "what": "stop"})  # in one read; its `handled` never seen
    c.follow_runner()
    assert c.judge_busy_since is None and c.judge_busy_s == pytest.approx(4)
    c._from_judge({"type": "handled", "n": 1})  # the late line adds nothing more
    assert c.judge_busy_s == pytest.approx(4)


def test_the_judges_limit_between_reports_ends_a_stage_sooner_never_later(clock):
    c = coordination(jit_out_of_sight=True)
    c.forward({"type": "stage", "stage": "correctness"})
    c._from_judge({"type": "handled", "n": 1})
    c._from_judge({"type": "limit", "stage": "correctness", "s": 2.0, "first_extra_s": 3.0})
    assert c._limit() == (T0 + 5, 5.0)  # before the stage's first report: the JIT allowance once
    clock.t = T0 + 4
    c.forward({"type": "trial", "n": 0})
    c._from_judge({"type": "handled", "n": 2})
    assert c._limit() == (T0 + 6, 2.0)
    c._from_judge({"type": "limit", "stage": "correctness", "s": 500.0, "first_extra_s": 0.0})
    assert c._limit() == (T0 + 30, 500.0)  # the stage's flat budget still holds


def test_the_jit_allowance_holds_only_while_a_compile_is_seen_and_up_to_its_cap(clock):
    watch = Watch()
    c = coordination(watch=watch)
    c.forward({"type": "stage", "stage": "correctness"})
    c._from_judge({"type": "handled", "n": 1})
    c._from_judge({"type": "limit", "stage": "correctness", "s": 2.0, "first_extra_s": 3.0})
    assert c._limit() == (T0 + 2, 2.0)  # no compile seen: the floor, the judge's allowance untaken
    watch.last_seen = T0 + 1.5  # a compiler at work: the floor runs from there
    assert c._limit() == (T0 + 3.5, 3.5)
    watch.last_seen = T0 + 6  # still compiling: up to the config's cap (8), past the judge's 3
    assert c._limit() == (T0 + 8, 8.0)
    watch.last_seen = T0 + 25  # compiling for ever (or a forgery): the cap holds
    assert c._limit() == (T0 + 10, 10.0)
    clock.t = T0 + 9
    c.forward({"type": "trial", "n": 0})  # the first report: the floor alone from now on
    c._from_judge({"type": "handled", "n": 2})
    assert c._limit() == (T0 + 11, 2.0)


def test_without_a_watch_no_allowance_is_granted(clock):
    c = coordination()
    c.forward({"type": "stage", "stage": "correctness"})
    c._from_judge({"type": "handled", "n": 1})
    c._from_judge({"type": "limit", "stage": "correctness", "s": 2.0, "first_extra_s": 3.0})
    assert c._limit() == (T0 + 2, 2.0)


@pytest.mark.parametrize(
    "msg",
    [
        {"type": "limit", "stage": "correctness", "s": -1},
        {"type": "limit", "stage": "correctness", "s": "2"},
        {"type": "limit", "stage": "correctness", "s": 2, "first_extra_s": -5},
        {"type": "limit", "stage": "not_a_stage", "s": 2},
        {"type": "handled", "n": "7"},
        {"type": "handled", "n": True},
    ],
)
def test_a_malformed_word_from_the_judge_changes_no_clock(clock, msg):
    c = coordination()
    c.forward({"type": "stage", "stage": "correctness"})
    c._from_judge(msg)
    assert c.report_limits == {} and c.judge_busy_since == T0 and c.handled == 0
