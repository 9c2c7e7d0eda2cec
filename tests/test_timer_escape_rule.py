"""The timer-escape guard decides on distributions measured in the same window, and confirms before
it fails: fake timing samples (no GPU) for a loaded GPU, a side stream and deferred work."""

from __future__ import annotations

import random

from kernelwright.core.config import GuardConfig
from kernelwright.engine.child.guards import EscapeRound, judge_escape, round_escapes

RATIO = GuardConfig().escape_ratio


def _round(rng, cand_event, cand_hidden, ref_event, load=0.0, sync=0.02, n=20, delay_ms=2.0):
    """One window of fake samples. `cand_hidden` ms of the candidate's work escape the events on
    every call. `load` (0..1): the chance that a call (candidate, reference or empty) is delayed on
    the host by up to `delay_ms` (a busy machine and GPU: the host/event ratio is inflated for both)."""
    r = EscapeRound([], [], [], [], [])

    def delay():
        return rng.uniform(0, delay_ms) if rng.random() < load else 0.0

    for _ in range(n):
        e = cand_event * rng.uniform(0.95, 1.1)
        r.cand_event.append(e)
        r.cand_host.append(e + cand_hidden + sync * rng.uniform(1, 2) + delay())
        e = ref_event * rng.uniform(0.95, 1.1)
        r.ref_event.append(e)
        r.ref_host.append(e + sync * rng.uniform(1, 2) + delay())
        r.empty_host.append(sync * rng.uniform(1, 2) + delay())
    return r


def test_an_honest_kernel_on_a_busy_machine_is_never_flagged():
    # the failure: host time 3x the event time because other processes shared the GPU
    rng = random.Random(0)
    flagged = 0
    for _trial in range(300):
        for load in (0.2, 0.5, 1.0):
            for cand_event in (0.02, 0.5):
                rounds = [_round(rng, cand_event, 0.0, 2.0, load=load) for _ in range(3)]
                flagged += judge_escape(rounds, RATIO).escaped
    assert flagged == 0


def test_one_delayed_window_alone_does_not_fail():
    rng = random.Random(1)
    bad = _round(rng, 0.5, 0.0, 2.0)
    bad.cand_host = [h * 4 for h in bad.cand_host]  # every candidate call in this window delayed 4x
    rounds = [bad, _round(rng, 0.5, 0.0, 2.0), _round(rng, 0.5, 0.0, 2.0)]
    assert round_escapes(bad.summary(), RATIO, 0.05)
    assert not judge_escape(rounds, RATIO).escaped


def test_a_side_stream_is_caught_in_every_window_even_on_a_loaded_gpu():
    rng = random.Random(2)
    for load in (0.0, 0.2):
        rounds = [_round(rng, 0.01, 1.0, 2.0, load=load, delay_ms=0.5) for _ in range(3)]  # events see ~nothing
        v = judge_escape(rounds, RATIO)
        assert v.escaped, (load, v.rounds)
        assert "escapes the timer" in v.detail and "same calls" in v.detail


def test_work_deferred_past_the_end_event_is_caught():
    rng = random.Random(3)
    rounds = [_round(rng, 0.3, 0.9, 2.0) for _ in range(3)]  # 0.3 ms seen, 0.9 ms after the end event
    assert judge_escape(rounds, RATIO).escaped


def test_no_verdict_of_escape_before_every_round_is_in():
    rng = random.Random(4)
    rounds = [_round(rng, 0.01, 1.0, 2.0) for _ in range(2)]
    assert not judge_escape(rounds, RATIO, confirm=3).escaped  # two of three: not yet confirmed
