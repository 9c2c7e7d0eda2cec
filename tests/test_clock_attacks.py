"""No forged speed-up survives: the judge holds the inputs, the reference and the clock.

Each file in tests/clock_attacks/ is a candidate for tests/fixtures/problems/swish.py whose honest
path is plain PyTorch (a speed-up of about 1x); its trick tries to make it look much faster from
inside the candidate's process (README there). The five classes of the clock issue run on the CPU,
under both isolation modes where the mode could matter (the predicted test set, work hidden behind
loaded cores); on a GPU (`gpu` tests) they run with CUDA tensors. Their figures on a quiet machine
are benchmarks/clock_checks.py's.
"""

from __future__ import annotations

import dataclasses
import shutil
import time

import pytest

from conftest import FIXTURES
from kernelwright.core.config import StageTimeouts, TimingConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate

ATTACKS = FIXTURES.parent / "clock_attacks"
SWISH = FIXTURES / "problems" / "swish.py"
# an honest PyTorch candidate times at 0.4-2.5x on a busy 2-core machine; a forged one at 8-265x before the fix
FORGED = 3.0
HAS_BWRAP = shutil.which("bwrap") is not None
# On the CPU these tests assert what no load may make happen: a verdict, a flag, and never a forged
# speed-up the record trusts (a loaded machine moves every figure, from 0.15x to 22x, and says so).
# The figures themselves (the honest control's band, each forgery's speed-up on a quiet machine, the
# GPU's bands) are benchmarks/clock_checks.py's.


def _config(base, sandbox: str = "none", device: str = "cpu", windows: int = 3):
    # the protocol's own defaults (not the test fixture's cheaper ones), in shorter windows
    timing = dataclasses.replace(TimingConfig(), windows=windows, window_ms=30.0, window_deadline_s=3.0)
    return dataclasses.replace(base, device=device, sandbox=sandbox, trials=2, timing=timing)


def run(cfg, name: str):
    return evaluate(SWISH, ATTACKS / name, cfg)


def flags(r) -> dict:
    return r.metadata.get("guards", {}).get("flags", {})


def not_forged(r) -> bool:
    # an attack the engine itself failed on proves nothing either way (a judge that could not
    # start once made every forgery here look defeated)
    assert r.status is not Status.ENGINE_ERROR, r.error_log
    return r.status is not Status.PASSED or (r.speedup is not None and r.speedup < FORGED)


def trusted_forgery(r) -> bool:
    """A speed-up of FORGED or more that the record trusts: for these candidates (the reference's own
    work, behind a trick), what must never happen, however loaded the machine."""
    assert r.status is not Status.ENGINE_ERROR, r.error_log
    return r.status is Status.PASSED and r.speedup is not None and r.speedup >= FORGED and r.speedup_trusted


SANDBOXES = ["none", pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed"))]


def test_honest_control_passes_and_is_never_trusted_with_a_forged_speedup(cpu_config):
    """The honest control (the reference's own code) in the sandbox the machine has: it passes on the
    judge's clock, no check flags it, and whatever the load does to its figure, a speed-up of FORGED
    or more is never trusted. (Its windows' page faults move with load too, as a window's calls
    follow the estimate of a call's time: the benchmark counts them.)"""
    r = run(_config(cpu_config, "bwrap" if HAS_BWRAP else "none"), "honest.py")
    assert r.status is Status.PASSED, r.error_log
    assert not trusted_forgery(r), (r.speedup, flags(r))
    assert r.metadata["timing"]["clock"] == "judge"
    assert "timed_output_mismatch" not in flags(r) and "faster_than_hardware" not in flags(r), flags(r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "replay_by_content.py",
        "rewrite_report.py",
        "swap_clock.py",
        "slow_reference.py",
        "deferred_output.py",  # most runs `incorrect` (its race with the judge's snapshot): the benchmark counts
    ],
)
def test_timing_forgeries_get_no_trusted_speedup(cpu_config, name):
    """Replay keyed on content, a rewritten report channel, a swapped clock, a slowed reference, an
    output filled after the call returned: every timed call has inputs never seen before, and the
    clock and the reference live in the judge. Tricks inside the candidate's own process, which the
    sandbox does not change: run in the sandbox the machine has."""
    r = run(_config(cpu_config, "bwrap" if HAS_BWRAP else "none"), name)
    assert not trusted_forgery(r), (r.status, r.speedup, flags(r), r.error_log)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["poison_shared_inputs.py", "skip_work.py"])
def test_window_tricks_fail_on_their_outputs(cpu_config, name):
    """Writing every input set of a window through the shared storage, skipping work in a burst:
    every timed output is checked against the reference's output for the judge's own copy of its
    inputs."""
    r = run(_config(cpu_config), name)
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.speedup, r.error_log)
    assert all(t.passed for t in r.trials), r.error_log  # right while being checked, wrong while timed
    assert "timed_output_mismatch" in flags(r), flags(r)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_work_hidden_in_the_commit_behind_slowed_measures_counts(cpu_config, sandbox):
    """Every timed call returns at once and the work runs inside the runner's commit, after
    `computed`; then busy processes load every core while the judge measures what a commit costs,
    so that the measure (what comes off the window) swallows the work. The judge measures before
    the window, where the runner cannot tell its moment from the reference's window, and takes off
    at most twice the stage's smallest measure: the deferred work is counted (7.9x before). On a
    machine loaded from outside (other tests, 2-3 busy loops) honest and hostile figures alike swing
    from 0.15x to 22x, and every one of them is `timing_unstable`: what must never happen is a
    speed-up the record trusts."""
    r = run(_config(cpu_config, sandbox), "inflate_measures.py")
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None
    assert r.speedup < 1.5 or not r.speedup_trusted, (r.speedup, flags(r))


def test_device_hog_while_idle_is_caught(cpu_config):
    """Loading the machine while the judge times the reference: the thread that does it is seen."""
    r = run(_config(cpu_config), "hold_device.py")
    assert not trusted_forgery(r), (r.status, r.speedup, r.error_log)
    assert "background_threads" in flags(r), flags(r)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_predicted_test_set_fails(cpu_config, sandbox):
    """The seed in the candidate's process is only the weights' seed: the inputs it re-draws are
    not the ones it is judged on, and its zeros on any other input fail."""
    r = run(_config(cpu_config, sandbox), "predict_seeds.py")
    assert r.status is Status.INCORRECT and r.speedup is None, (r.status, r.error_log)
    assert not any(t.passed for t in r.trials)


@pytest.mark.slow
def test_window_that_never_closes_times_out(cpu_config):
    cfg = _config(cpu_config)
    cfg = dataclasses.replace(
        cfg, timeouts=StageTimeouts(startup=60, build=60, init=30, correctness=60, timing=120, profile=30)
    )
    t0 = time.monotonic()
    r = run(cfg, "never_close.py")
    assert r.status is Status.TIMEOUT, (r.status, r.error_log)
    assert "timing window" in r.error_log, r.error_log
    assert time.monotonic() - t0 < 60


# ---- the same on a GPU ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    [
        "honest.py",
        "replay_by_content.py",
        "rewrite_report.py",
        "swap_clock.py",
        "slow_reference.py",
        "inflate_measures.py",
        "inflate_probe.py",
    ],
)
def test_gpu_timing_forgeries_get_no_speedup(cpu_config, name):
    r = run(_config(cpu_config, device="cuda"), name)
    assert not_forged(r), (name, r.status, r.speedup, r.error_log)
    if name == "honest.py":
        assert r.status is Status.PASSED, r.error_log
        assert r.metadata["timing"]["fixed_costs"] == "device clock", r.metadata["timing"]["fixed_costs"]
        # the reference's own code: about 1x where the record trusts its timing (a clock that charges
        # the candidate what is not its work shows here first). A GPU shared with other work (the
        # other workers of a parallel gpu suite) may leave the figure untrusted, saying why; never a
        # trusted one outside the band.
        said = flags(r)
        if r.speedup_trusted:
            assert 0.8 < r.speedup < 1.25, (r.speedup, said)
        else:
            assert "timing_unstable" in said, (r.speedup, said)


@pytest.mark.gpu
def test_gpu_work_moved_into_the_copy_in_gains_at_most_the_drift_cap(cpu_config):
    """Its output buffers' zero fill moved into the judge's copy in (on a stream that does not wait
    for `in`), and the device kept busy while the judge measures the next copy: what comes off a
    window's copy in stays within its own measure, COPY_IN_DRIFT x the stage's smallest and the
    phase, and no forged speed-up survives (honest, the zero fill is in its calls: about 0.7x)."""
    from kernelwright.engine.child.timing.device_clock import COPY_IN_DRIFT

    r = run(_config(cpu_config, device="cuda"), "inflate_copy_in.py")
    assert not_forged(r), (r.status, r.speedup, r.error_log)
    timing = r.metadata["timing"]
    if timing.get("fixed_costs") != "device clock":
        pytest.skip(f"the device clock was off here: {timing.get('device_clock')}")
    smallest = max(timing["device_clock"]["copy_in_ms"].values())
    for w in timing["windows"]:
        d = w["device_ms"]
        assert d["off"]["copy_in"] <= min(d["measured"]["copy_in"], d["copy_in"]) + 1e-3, d
        assert d["off"]["copy_in"] <= COPY_IN_DRIFT * smallest + 1e-3, (d, smallest)
    assert r.speedup is None or r.speedup < 1.2 or not r.speedup_trusted, (r.speedup, flags(r))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["honest.py", "inflate_probe.py", "inflate_measures.py"])
def test_gpu_the_wall_clock_still_holds_where_the_device_clock_is_off(cpu_config, name):
    # the windows a GPU without stream memory operations gets: the judge's wall clock and its probe
    cfg = _config(cpu_config, device="cuda")
    cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, device_clock=False))
    r = run(cfg, name)
    assert not_forged(r), (name, r.status, r.speedup, r.error_log)
    if name == "honest.py":
        assert r.status is Status.PASSED, r.error_log
        assert r.metadata["timing"]["device_clock"] == {"off": "timing.device_clock is off"}


@pytest.mark.gpu
def test_gpu_predicted_test_set_fails(cpu_config):
    r = run(_config(cpu_config, device="cuda"), "predict_seeds.py")
    assert r.status is Status.INCORRECT, (r.status, r.error_log)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["poison_shared_inputs.py", "skip_work.py", "deferred_output.py"])
def test_gpu_window_tricks_fail(cpu_config, name):
    r = run(_config(cpu_config, device="cuda"), name)
    assert r.status is Status.INCORRECT, (name, r.status, r.speedup, r.error_log)


@pytest.mark.gpu
def test_gpu_work_off_the_timed_stream_gains_nothing(cpu_config):
    # the side stream (PyTorch's streams never wait for the legacy one) waits for no input and the
    # commit does not wait for it: its kernels race the judge's copy in and the commit. Whichever
    # wins, nothing is gained: kernels that ran before the inputs landed, or after the commit
    # read their outputs, leave wrong slots (`incorrect`); outputs that are right were made from
    # the window's inputs before the commit read them, inside the judge's span (timed). Either
    # may happen on a run.
    r = run(_config(cpu_config, device="cuda"), "side_stream.py")
    assert r.status in (Status.INCORRECT, Status.PASSED), (r.status, r.error_log)
    assert not_forged(r), (r.status, r.speedup, r.error_log)
    # the control: a side stream ordered after the current one and waited for is an honest model
    r = run(_config(cpu_config, device="cuda"), "side_stream_synced.py")
    assert r.status is Status.PASSED, (r.status, r.error_log)
    assert r.metadata["timing"]["fixed_costs"] == "device clock"


@pytest.mark.gpu
def test_gpu_device_hog_gets_no_speedup(cpu_config):
    r = run(_config(cpu_config, device="cuda"), "hold_device.py")
    assert not_forged(r), (r.status, r.speedup, r.error_log)


@pytest.mark.gpu
def test_gpu_window_that_never_closes_times_out(cpu_config):
    r = run(_config(cpu_config, device="cuda"), "never_close.py")
    assert r.status is Status.TIMEOUT, (r.status, r.error_log)
