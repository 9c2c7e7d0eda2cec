"""A stuck call is stopped at the floor; the JIT allowance holds only while a compile is seen at work
(a compiler burning CPU in the runner's tree, its JIT caches growing), up to its cap, so an honest
first call that compiles is not timed out and a candidate that fakes a compile gains no more than
the cap. The watch itself: a real compiler is seen, a sleeping process named like one is not."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ADD_ONE, CANDIDATES
from kernelwright.core.record import Stage, Status
from kernelwright.engine import evaluate
from kernelwright.engine.compile_watch import CompileWatch, jit_dirs

# ---- the watch ---------------------------------------------------------------------------------


def _parent_of(cmd: str) -> subprocess.Popen:
    """A shell that runs `cmd` as its child (as a runner runs its compiler)."""
    return subprocess.Popen(["sh", "-c", f"{cmd}; sleep 30"], start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """The shell and its compiler both (killing the shell alone leaves gcc at work, about 40 s of a core)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _seen_within(watch: CompileWatch, seconds: float) -> float | None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if watch.look() is not None:
            return watch.last_seen
        time.sleep(0.1)
    return None


@pytest.mark.skipif(shutil.which("g++") is None or sys.platform != "linux", reason="needs g++ and /proc")
def test_a_compiler_at_work_in_the_tree_is_seen(tmp_path):
    # a translation unit that keeps cc1plus busy for a while: many template instantiations
    src = tmp_path / "heavy.cpp"
    src.write_text(
        "#include <map>\n#include <string>\n#include <vector>\n"
        + "".join(
            f"std::map<std::string, std::vector<int>> f{i}() {{ std::map<std::string, std::vector<int>> m;"
            f' m["{i}"].push_back({i}); return m; }}\n'
            for i in range(3000)
        )
    )
    proc = _parent_of(f"g++ -O2 -c {src} -o {tmp_path / 'heavy.o'}")
    try:
        watch = CompileWatch(proc.pid, [])
        assert _seen_within(watch, 20) is not None
        assert set(watch.seen) & {"cc1plus", "g++", "as"}
    finally:
        _stop(proc)


@pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")
def test_a_sleeping_process_named_like_a_compiler_is_not_seen(tmp_path):
    fake = tmp_path / "cc1plus"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    proc = _parent_of(f"{fake} 30")
    try:
        watch = CompileWatch(proc.pid, [])
        assert _seen_within(watch, 2.0) is None
    finally:
        _stop(proc)


def test_a_growing_jit_cache_is_seen_and_a_quiet_one_is_not(tmp_path):
    env = {"TMPDIR": str(tmp_path), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    (tmp_path / "triton").mkdir()
    (tmp_path / "wire.kwt").write_text("the judge's inputs: not a cache")
    watch = CompileWatch(2**22 + 7, jit_dirs(env))  # no such process: the caches only
    assert _seen_within(watch, 1.0) is None
    (tmp_path / "wire2.kwt").write_text("more inputs, outside every cache")
    assert _seen_within(watch, 1.0) is None
    (tmp_path / "triton" / "abc").mkdir()
    (tmp_path / "triton" / "abc" / "kernel.cubin").write_bytes(b"\0" * 64)
    assert _seen_within(watch, 1.0) is not None and watch.seen == ["jit cache"]


# ---- the coordinator's limits -------------------------------------------------------------------

# says Triton (so the judge grants the allowance), runs nothing of it, and spins: a stuck kernel
SPINS_AS_TRITON = '''"""A Triton kernel (@triton.jit) whose launch never returns."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            pass
'''

# compiles a C++ extension at its first call, longer than the floor on a cold cache
COMPILES_AT_FIRST_CALL = (CANDIDATES / "cpp_builds_at_first_call.py").read_text()

# fakes a compile: a process named cc1plus that burns a core, while forward spins
FAKES_A_COMPILE = """import os, shutil, subprocess, sys, tempfile
import torch.nn as nn

fake = os.path.join(tempfile.mkdtemp(), "cc1plus")
shutil.copy(sys.executable, fake)


class ModelNew(nn.Module):
    def forward(self, x):
        subprocess.Popen([fake, "-c", "while True: pass"])
        while True:
            pass
"""


def test_a_stuck_call_of_a_jit_candidate_is_stopped_at_the_floor(cpu_config):
    cpu_config.timeouts.correctness = 120
    cpu_config.timeouts.call_floor = 3
    cpu_config.timeouts.jit_allowance = 60  # granted by the judge, never taken: no compile runs
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=SPINS_AS_TRITON)
    assert r.status is Status.TIMEOUT and r.error_stage is Stage.CORRECTNESS
    assert r.metadata["correctness_first_call_extra_s"] == 60
    assert "did not return within 3 s" in r.error_log
    assert r.stage_times.correctness_s < 15 and "compile_seen" not in r.metadata


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("g++") is None, reason="needs ninja and g++")
def test_an_honest_first_call_that_compiles_is_not_timed_out(cpu_config):
    cpu_config.timeouts.correctness = 300
    cpu_config.timeouts.call_floor = 2  # the build takes many times this
    cpu_config.timeouts.jit_allowance = 280
    cpu_config.shapes = "off"
    cpu_config.time_candidate = False
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=COMPILES_AT_FIRST_CALL)
    assert r.status is Status.PASSED, r.error_log
    assert r.stage_times.correctness_s > cpu_config.timeouts.call_floor
    assert set(r.metadata["compile_seen"]) & {"cc1plus", "g++", "c++", "ninja"}


@pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")
def test_a_faked_compile_gains_no_more_than_the_cap(cpu_config):
    cpu_config.timeouts.correctness = 120
    cpu_config.timeouts.call_floor = 2
    cpu_config.timeouts.jit_allowance = 4
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=FAKES_A_COMPILE)
    assert r.status is Status.TIMEOUT and r.error_stage is Stage.CORRECTNESS
    assert r.metadata.get("compile_seen") == ["cc1plus"]  # the forgery was seen, and held to its cap
    assert r.stage_times.correctness_s < 2 + 4 + 8


def test_a_candidate_that_compiles_out_of_sight_keeps_the_whole_allowance(cpu_config):
    cpu_config.timeouts.correctness = 120
    cpu_config.timeouts.call_floor = 2
    cpu_config.timeouts.jit_allowance = 3
    text = (CANDIDATES / "py_infinite_loop.py").read_text() + "\nforward_compiled = 'torch.compile'  # tracing\n"
    r = evaluate(ADD_ONE, None, cpu_config, candidate_text=text)
    assert r.status is Status.TIMEOUT and "did not return within 5 s" in r.error_log
