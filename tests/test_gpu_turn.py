"""The GPU's turn (engine/child/gpu_turn.py): one judge at a time holds it, a waiting one gives up
after its limit and says the device was shared, and a lock file a candidate could tamper with is
never trusted, never followed and never waited on for ever. On the CPU: the lock itself is plain
flock, the same on any machine."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import threading
import time

import pytest

from kernelwright.engine.child.gpu_turn import GpuTurn


def _hold(directory: str, key: str, ready, release) -> None:  # another judge, in another process
    turn = GpuTurn(key, 5.0, directory).take()
    ready.set()
    release.wait(30)
    turn.release()


@pytest.fixture
def other_judge(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    d = str(tmp_path / "turns")
    p = ctx.Process(target=_hold, args=(d, "GPU-a", ready, release), daemon=True)
    p.start()
    assert ready.wait(60)
    yield d, release
    release.set()
    p.join(30)


def test_a_free_turn_is_taken_at_once_and_recorded(tmp_path):
    turn = GpuTurn("GPU-a", 5.0, str(tmp_path / "turns")).take()
    assert turn.held and not turn.shared and not turn.why_none and turn.waited_s < 1.0
    assert stat.S_IMODE(os.stat(tmp_path / "turns").st_mode) == 0o700
    assert turn.check() == "" and turn.facts()["held"] is True
    turn.release()
    again = GpuTurn("GPU-a", 5.0, str(tmp_path / "turns")).take()  # released: the next judge's at once
    assert again.held
    again.release()


def test_a_judge_waits_for_the_turn_and_says_when_it_never_came(other_judge):
    d, _ = other_judge
    t0 = time.monotonic()
    turn = GpuTurn("GPU-a", 0.5, d).take()
    assert 0.5 <= time.monotonic() - t0 < 5.0
    assert not turn.held and "another kernelwright evaluation drove this GPU" in turn.shared
    assert turn.check() == turn.shared and turn.facts()["shared"]
    other = GpuTurn("GPU-b", 0.5, d).take()  # another GPU's turn is its own
    assert other.held and not other.shared
    turn.release()
    other.release()


def test_the_turn_comes_when_the_holder_lets_go(other_judge):
    d, release = other_judge
    threading.Timer(0.5, release.set).start()
    turn = GpuTurn("GPU-a", 20.0, d).take()
    assert turn.held and not turn.shared and 0.3 < turn.waited_s < 20.0
    turn.release()


def test_a_replaced_lock_file_makes_the_turn_shared(tmp_path):
    d = str(tmp_path / "turns")
    turn = GpuTurn("GPU-a", 1.0, d).take()
    assert turn.held
    os.unlink(turn.path)  # what a runner without a sandbox could do, to let a second judge in
    second = GpuTurn("GPU-a", 1.0, d).take()
    assert second.held  # a new file, a new lock: two judges "hold" the turn...
    assert "removed" in turn.check() or "replaced" in turn.check()  # ...and the first one knows
    os.replace(second.path, second.path + ".old")
    open(second.path, "w").close()
    assert "replaced" in second.check()
    turn.release()
    second.release()


def test_a_fifo_or_a_link_in_the_lock_files_place_is_refused_without_waiting(tmp_path):
    d = tmp_path / "turns"
    first = GpuTurn("GPU-a", 1.0, str(d)).take()  # (makes the directory)
    first.release()
    os.unlink(first.path)
    os.mkfifo(first.path)
    t0 = time.monotonic()
    fifo = GpuTurn("GPU-a", 1.0, str(d)).take()
    assert time.monotonic() - t0 < 1.0 and not fifo.held and "not a plain file" in fifo.why_none
    os.unlink(first.path)
    target = tmp_path / "elsewhere"
    target.write_text("x")
    os.symlink(target, first.path)
    link = GpuTurn("GPU-a", 1.0, str(d)).take()
    assert not link.held and link.why_none and target.read_text() == "x"
    assert not fifo.shared and not link.shared  # no turn to be had is not contention


def test_a_directory_others_may_write_is_not_used(tmp_path):
    d = tmp_path / "turns"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o777)
    turn = GpuTurn("GPU-a", 1.0, str(d)).take()
    assert not turn.held and "may be written by others" in turn.why_none
    os.chmod(d, 0o700)
    os.symlink(d, tmp_path / "link")
    via_link = GpuTurn("GPU-a", 1.0, str(tmp_path / "link")).take()
    assert not via_link.held and "not a directory" in via_link.why_none


def _judge(wait: float, device: str = "cuda"):
    from types import SimpleNamespace

    import torch

    from kernelwright.core.config import TimingConfig

    cfg = SimpleNamespace(timing=TimingConfig(gpu_turn_wait_s=wait))
    return SimpleNamespace(
        cfg=cfg,
        turn=None,
        device=torch.device(device),
        rec=SimpleNamespace(metadata={}),
        handoff=None,
        anchor=None,
        device_clock_off="",
    )


def test_the_judge_takes_its_turn_on_a_gpu_only_and_once(tmp_path, monkeypatch):
    """JudgeTiming.take_turn, as `r_compiled` calls it: on a GPU, the device's turn under its identity;
    on the CPU, or with the wait set to 0, none; a GPU with no identity is recorded, not fatal."""
    import functools

    from kernelwright.engine.child import judge_timing

    monkeypatch.setattr(judge_timing, "gpu_key", lambda device: "GPU-0000")
    monkeypatch.setattr(judge_timing, "GpuTurn", functools.partial(GpuTurn, directory=str(tmp_path / "t")))
    j = _judge(5.0)
    judge_timing.JudgeTiming.take_turn(j)
    assert j.turn is not None and j.turn.held and j.turn.path.endswith("GPU-0000.lock")
    first = j.turn
    judge_timing.JudgeTiming.take_turn(j)  # (a second report of `compiled` takes nothing more)
    assert j.turn is first
    waiting = _judge(0.2)
    judge_timing.JudgeTiming.take_turn(waiting)  # another judge in this process: flock is per open file
    assert not waiting.turn.held and waiting.turn.shared
    first.release()
    for off in (_judge(5.0, "cpu"), _judge(0.0)):
        judge_timing.JudgeTiming.take_turn(off)
        assert off.turn is None

    def no_identity(device):
        raise RuntimeError("no uuid")

    monkeypatch.setattr(judge_timing, "gpu_key", no_identity)
    j = _judge(5.0)
    judge_timing.JudgeTiming.take_turn(j)
    assert j.turn is None and "no identity for the GPU" in j.rec.metadata["gpu_turn"]["none"]


def test_the_start_up_anchor_is_measured_in_the_turn_and_again_when_the_checks_turn_begins(tmp_path, monkeypatch):
    """JudgeTiming.measure_anchor (a judge's start-up, a spare's too): the probe's empty windows run
    while this judge holds the GPU's turn, which it lets go at once; when the turn for the checks
    begins (`take_turn`) they are measured again and the lesser hand-over stands."""
    import functools

    from kernelwright.engine.child import judge_timing
    from kernelwright.engine.child.timing import device_clock

    d = str(tmp_path / "t")
    monkeypatch.setattr(judge_timing, "gpu_key", lambda device: "GPU-0000")
    monkeypatch.setattr(judge_timing, "GpuTurn", functools.partial(GpuTurn, directory=d))
    held_while_measured = []

    def measure(device, config, has_socket):  # the probe's windows: is another judge kept off meanwhile?
        other = GpuTurn("GPU-0000", 0.0, d).take()
        held_while_measured.append(not other.held)
        other.release()
        return device_clock.Anchor(switch_ms=1.6, startup_ms=1.6), ""

    monkeypatch.setattr(judge_timing, "measure_anchor", measure)
    monkeypatch.setattr(judge_timing, "switch_ms", lambda device, config: 0.3)
    j = _judge(5.0)
    judge_timing.JudgeTiming.measure_anchor(j)
    assert held_while_measured == [True] and j.anchor.startup_turn == "held"
    after = GpuTurn("GPU-0000", 0.0, d).take()  # let go once the windows were done
    assert after.held
    after.release()
    judge_timing.JudgeTiming.take_turn(j)
    assert j.anchor.switch_ms == 0.3 and j.anchor.startup_ms == 1.6 and j.anchor.in_turn_ms == 0.3
    j.turn.release()

    blocker = GpuTurn("GPU-0000", 0.0, d).take()  # another evaluation drives the GPU all along
    late = _judge(0.2)
    judge_timing.JudgeTiming.measure_anchor(late)  # measured all the same, and said so
    assert late.anchor is not None and late.anchor.startup_turn == "not had within 0.2 s"
    blocker.release()
    off = _judge(0.0)
    judge_timing.JudgeTiming.measure_anchor(off)
    assert off.anchor.startup_turn.startswith("no turns")


def test_the_parent_takes_the_judges_turn_for_a_profile_only_under_the_recorded_key():
    """`after_the_judge`: the parent's work on the GPU after the judge (ncu, compute-sanitizer) waits
    for the same lock, under the key the judge's record names; without one (the CPU, a judge that
    took no turn, turns off) it takes none."""
    import uuid

    from kernelwright.engine.child.gpu_turn import after_the_judge

    key = f"GPU-test-{uuid.uuid4()}"
    assert after_the_judge(None, 5.0) is None
    assert after_the_judge({"none": "no identity for the GPU"}, 5.0) is None
    assert after_the_judge({"key": key}, 0.0) is None
    judge = GpuTurn(key, 5.0).take()  # the judge's own, in the user's real turn directory
    try:
        waiting = after_the_judge({"key": key, "held": True}, 0.2)
        assert waiting is not None and not waiting.held and waiting.shared
        waiting.release()
    finally:
        judge.release()
    parent = after_the_judge({"key": key}, 5.0)
    assert parent is not None and parent.held
    parent.release()
    os.unlink(parent.path)
