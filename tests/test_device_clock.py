"""The device clock's arithmetic (engine/child/timing/device_clock.py), on the CPU: what comes off a window,
and the regions the runner takes from a header. Its windows themselves are `gpu` tests
(test_clock_attacks.py, test_engine_gpu.py)."""

from __future__ import annotations

import pytest

from kernelwright.engine.child.timing import device_clock as dc


def phases(**kw):
    base = dict(
        calls=50,
        in_bytes=1000,
        out_bytes=1000,
        copies=50,
        copy_in_ms=4.4,
        middle_ms=9.1,
        snapshot_ms=4.25,
        cal_copy_in_ms=4.4,
        cal_snapshot_ms=4.25,
        cal_commit_ms=4.4,
    )
    base.update(kw)
    return dc.Phases(**base)


def test_an_honest_window_loses_its_copies_and_the_switches():
    cal = dc.Calibration(anchor=dc.Anchor(switch_ms=0.29))
    p = phases()
    cal.see(p)
    cal.see_switch(0.29)
    # span 17.75 - copy in 4.4 - snapshot 4.25 - (commit 4.4 + switches 0.29) = 4.41 ms of calls
    assert cal.candidate_ms(p) == pytest.approx(4.41 / 50)


def test_the_launch_figures_take_off_the_messages_and_the_judges_own_work():
    from kernelwright.engine.child.timing.window_facts import launch_facts

    cal = dc.Calibration(anchor=None)
    cal.see_armed(0.4)
    cal.see_armed(None)  # (an empty window that went on without `armed`)
    cal.see_armed(0.3)
    p = phases(calls=256, queued_ms=9.0, judge_host_ms=0.7)
    assert cal.launch_ms(p) == pytest.approx((9.0 - 0.3 - 0.7) / 256)
    assert cal.launch_ms(phases(queued_ms=None)) is None  # timed as it was queued: no separate figure
    assert cal.launch_ms(phases(queued_ms=0.1, judge_host_ms=0.7)) == 0.0
    # a call launched alone takes the larger of its device time and its launch: a tiny kernel
    # 3x the reference's device work but 2x its launch time is about 0.5x as launched
    rows = [(0.0072, 0.020, 0.0024, 0.040)] * 5
    facts = launch_facts(rows)
    assert facts["speedup_as_launched"] == pytest.approx(0.5)
    assert facts["candidate_host_ms"] == pytest.approx(0.040) and facts["windows"] == 5
    # a window whose host was held by something else (17 ms for what took 7): the quickest is the host's
    rows = [(0.0072, 0.020, 0.0024, h) for h in (0.066, 0.040, 0.045, 0.041, 0.050)]
    assert launch_facts(rows)["candidate_host_ms"] == pytest.approx(0.040)
    assert launch_facts(rows)["speedup_as_launched"] == pytest.approx(0.5)
    # where both sides' device work outlasts their launches, as launched is the device's figure
    assert launch_facts([(0.45, 0.05, 0.1, 0.02)])["speedup_as_launched"] == pytest.approx(4.5)
    assert launch_facts([]) == {}


def test_nothing_comes_off_beyond_the_phase_it_belongs_to():
    cal = dc.Calibration(anchor=None)
    cal.see(phases())
    # a runner that skipped the commit and its calls: its part of the window is 0.3 ms
    p = phases(middle_ms=0.3, copy_in_ms=1.0, snapshot_ms=0.5)
    off = cal.off(p)
    assert off == {"copy_in": 1.0, "snapshot": 0.5, "commit_and_switch": 0.3}
    assert cal.candidate_ms(p) == 0.0


def test_the_smallest_measure_of_the_stage_comes_off():
    # work run beside the judge's own copies (another context, time-sliced) can only slow them
    cal = dc.Calibration(anchor=None)
    for c in (9.0, 4.4, 7.0):
        cal.see(phases(cal_copy_in_ms=c, cal_snapshot_ms=c, cal_commit_ms=c))
    p = phases(copy_in_ms=8.8)
    assert cal.off(p)["copy_in"] == 4.4
    assert cal.off(p)["snapshot"] == 4.25  # (capped by the phase: 4.25 ms)


def test_the_copy_in_takes_off_the_windows_own_measure_within_the_drift_cap():
    # level1/46_task of CUDA-L1 on an H200: the stage's smallest copy in was an early window's
    # 4.31 ms; every later window's copy took 4.82 ms and its own measure just before it 4.81 ms.
    # The stage's smallest left 0.5 ms a window (28 us a call) on the candidate: it read 8% slow.
    cal = dc.Calibration(anchor=None)
    cal.see(phases(cal_copy_in_ms=4.31))
    late = phases(copy_in_ms=4.82, cal_copy_in_ms=4.81)
    cal.see(late)
    assert cal.off(late)["copy_in"] == pytest.approx(4.81)
    # a measure inflated by work beside it (the runner's, time-sliced) gains at most the cap ...
    inflated = phases(copy_in_ms=9.0, cal_copy_in_ms=9.0)
    cal.see(inflated)
    assert cal.off(inflated)["copy_in"] == pytest.approx(dc.COPY_IN_DRIFT * 4.31)
    # ... and never more than the phase took
    quick = phases(copy_in_ms=4.5, cal_copy_in_ms=5.0)
    cal.see(quick)
    assert cal.off(quick)["copy_in"] == pytest.approx(4.5)
    # the snapshot and the commit still take off the stage's smallest
    assert cal.off(late)["snapshot"] == pytest.approx(4.25)


def test_the_switches_are_capped_by_the_start_up_anchor():
    cal = dc.Calibration(anchor=dc.Anchor(switch_ms=0.3))
    cal.see(phases())
    cal.see_switch(5.0)  # every empty window slowed: another context kept the device busy
    off = cal.off(phases())["commit_and_switch"]
    assert off == pytest.approx(4.4 + 1.25 * 0.3 + dc.SLACK_MS)
    assert "another context" in cal.contended()
    calm = dc.Calibration(anchor=dc.Anchor(switch_ms=0.3))
    calm.see_switch(0.31)
    assert calm.contended() == ""


def test_an_anchor_taken_beside_another_evaluations_windows_gives_way_to_the_one_taken_in_the_turn():
    # a spare's start-up anchor measured while another evaluation drove the device: its hand-over is long
    a = dc.Anchor(switch_ms=1.6, startup_ms=1.6)
    loose = dc.Calibration(anchor=a)
    loose.see_switch(4.0)  # the stage's empty windows slowed by another context
    assert loose.contended() == ""  # against the long anchor the contention goes unseen
    wide = loose.off(phases())["commit_and_switch"]
    a.see_in_turn(0.3)  # measured again when the judge's own turn began: the lesser stands
    assert a.switch_ms == 0.3 and a.startup_ms == 1.6 and a.in_turn_ms == 0.3
    assert loose.off(phases())["commit_and_switch"] < wide
    assert "another context" in loose.contended()
    assert a.to_json() == {"switch_ms": 0.3, "startup_ms": 1.6, "in_turn_ms": 0.3, "startup_turn": ""}


@pytest.mark.parametrize("again", [5.0, None])
def test_an_anchor_measured_again_never_widens_what_comes_off(again):
    # work the candidate left running (or a probe that failed) only lengthens or loses the second measure
    a = dc.Anchor(switch_ms=0.3, startup_ms=0.3)
    cap = a.switch_cap()
    a.see_in_turn(again)
    assert a.switch_ms == 0.3 and a.switch_cap() == cap and a.in_turn_ms == again


def test_without_an_anchor_the_switches_take_off_at_most_the_fixed_cap():
    cal = dc.Calibration(anchor=None)
    cal.see(phases())
    cal.see_switch(5.0)
    assert cal.off(phases())["commit_and_switch"] == pytest.approx(4.4 + dc.SWITCH_CAP_MS)


@pytest.mark.parametrize(
    "spec",
    [
        None,
        [["inputs", 1, 100]],  # three fields
        [["elsewhere", 1, 100, True]],
        [["flags", 1, -5, True]],
        [["flags", 1, 1 << 50, True]],
        [["flags", 1, 100, True]],  # new, but no descriptor came
        [["flags", 7, 100, False]],  # never mapped
        [["flags", 1, 100, False]] * 4,
    ],
)
def test_the_runner_refuses_malformed_lent_regions(spec):
    import torch

    with pytest.raises(ValueError):
        dc.Lent().take(spec, [], 1 << 40, torch.device("cpu"))


_STEPS = r"""
import torch
from kernelwright.engine.child.timing import device_clock as dc
from kernelwright.engine.child.timing.layouts import Layout
from kernelwright.engine.child.timing.window_timer import _rebuild

dev = torch.device("cuda")
clock = dc.Clock(dev)
outs = [torch.randn(256, 256, device=dev) for _ in range(8)]
layout = Layout.of_outputs(outs[0])
snap = torch.empty(8 * layout.stride, dtype=torch.uint8, device=dev)
block = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device=dev)
before = block.clone()
cal = clock.calibrate(block, snap, outs, layout)
assert all(ms > 0 for ms in cal), cal
assert torch.equal(block, before)  # (the copy in is measured on the block onto itself)
got = [_rebuild(o, s) for o, s in zip(outs, layout.sets(dc.shared_region.Region(snap, snap.numel(), -1), 8))]
assert all(torch.equal(g, o) for g, o in zip(got, outs))
# a window whose `done` never comes: the judge's stream waits on it until `release` writes it
flags = clock.flags_region()
stream = torch.cuda.current_stream(dev)
clock.ops.wait(stream, flags.tensor.data_ptr() + dc.DONE_AT, 5)
clock.events[3].record()
assert not clock.events[3].query()
clock.release(5, wait_s=20.0)
assert not clock.stuck and clock.events[3].query()
clock.close()
# the reference's window is queued whole before the device starts it: the host's pauses between
# its launches are not in the span, unless the head start runs out first (then it says so)
import time
x = torch.zeros(1024, device=dev)
x.add_(1)  # (a kernel's first launch loads it, and the load waits for the device)
torch.cuda.synchronize()
def slow_launches():
    for _ in range(20):
        time.sleep(0.001)
        x.add_(1)
    return x
_, span, host, ahead = dc.queued_ahead(dev, slow_launches, 150.0)  # (its sleep: the head start's cap)
assert ahead and host >= 20 and span < 5, (span, host, ahead)
_, span, host, ahead = dc.queued_ahead(dev, slow_launches, 0.0)
assert not ahead and span >= 15, (span, host, ahead)
assert x[0].item() == 41
print("ok", cal)
"""


@pytest.mark.gpu
def test_gpu_the_judges_own_steps_finish():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


_STARTUP = r"""
import os, socket
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.judge import Judge

r, w = os.pipe()
a, b = socket.socketpair()
judge = Judge({"config": {"device": "cuda"}}, Channel(w), a.detach())
judge.startup()  # what the judge's main runs before any job: the probe and the device clock's anchor
assert judge.anchor is not None, judge.device_clock_off
assert judge.anchor.switch_ms is not None and 0 < judge.anchor.switch_ms < 5, judge.anchor.switch_ms
print("ok", judge.anchor.switch_ms)
"""


@pytest.mark.gpu
def test_gpu_the_judges_start_up_measures_its_anchor():
    # the whole start-up a judge runs, in its own process (a reference to job state it does not have
    # yet failed every GPU evaluation once, while the clock's own steps passed)
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _STARTUP], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
