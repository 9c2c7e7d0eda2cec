"""The judge's and the runner's heap keep what is freed: a window's outputs reuse pages already faulted in (heap.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

from kernelwright.engine.child import heap
from kernelwright.engine.isolation import environment

PROGRAM = textwrap.dedent(
    """
    import resource, sys
    import torch
    from kernelwright.engine.child import heap

    if sys.argv[1] == "keep":
        assert heap.keep_freed_memory()
    torch.set_num_threads(1)
    x = torch.randn(1024, 1024)
    faults = []
    for window in range(6):  # a window's outputs kept until it ends, then freed, as serve_window does
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        outs = [x * torch.sigmoid(x) for _ in range(16)]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        del outs
    print(*faults)
    """
)


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=120, check=True)
    return [int(v) for v in out.stdout.split()]


def test_freed_outputs_are_mostly_reused():
    """With glibc's defaults a window's outputs fault every page again, window after window (32,736 of
    32,800 here, where small allocations landed so that the top was trimmed); with the policy the
    later windows, five of them together, fault less than one window's outputs and temporaries
    (16 outputs and 16 temporaries of 4 MiB: 32,768 pages). Where small allocations split the freed
    top the heap still grows now and then (0-21,505 pages over the five, varying with the layout)."""
    kept = _faults("keep")
    assert kept[0] > 8000, kept  # the first window grows the heap
    assert sum(kept[1:]) < 32 * 1024, kept


def test_cpu_evaluations_start_with_glibcs_small_chunk_cache_off(cpu_config, tmp_path):
    """The tcache kept freed tensor metadata between a window's freed outputs, which then did not
    coalesce: a runner's heap grew (a fault per 4 KiB) in a third of its timed windows (heap.py)."""
    env = environment.child_env(dataclasses.replace(cpu_config, device="cpu"), tmp_path)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=0"
    assert "GLIBC_TUNABLES" not in environment.child_env(dataclasses.replace(cpu_config, device="cuda"), tmp_path)
    mine = "glibc.malloc.arena_max=2"
    assert heap.with_tunable(mine, heap.NO_TCACHE) == mine + ":" + heap.NO_TCACHE
    assert heap.with_tunable("glibc.malloc.tcache_count=7", heap.NO_TCACHE).endswith("=7")
    assert heap.with_tunable("", heap.NO_TCACHE) == heap.NO_TCACHE


def test_a_child_keeps_the_heap_setting_to_itself(monkeypatch):
    """glibc read it when the process started; the compilers the process starts go without it."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:" + heap.NO_TCACHE)
    heap.keep_tunables_to_itself()
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    monkeypatch.setenv("GLIBC_TUNABLES", heap.NO_TCACHE)
    heap.keep_tunables_to_itself()
    assert "GLIBC_TUNABLES" not in os.environ
