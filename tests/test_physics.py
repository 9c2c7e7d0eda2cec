"""The physics check (`faster_than_hardware`) trusts its peaks only while they are a ceiling: an honest
candidate is never flagged because a measured peak came out low (a measurement taken while the
machine was busy is cached, and every later evaluation read it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelwright import api
from kernelwright.engine.child import gpu_facts
from kernelwright.engine.child.judge_timing import peaks_hold

MATMUL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


N = 384


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
"""

CANDIDATE = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)
"""


def _files(tmp_path: Path, problem_text: str, candidate_text: str) -> tuple[Path, Path, Path]:
    problem, cand = tmp_path / "problem.py", tmp_path / "candidate.py"
    problem.write_text(problem_text)
    cand.write_text(candidate_text)
    return problem, cand, tmp_path / "cache"


def _plant_peaks(cache: Path, peaks: dict) -> Path:
    """`peaks` as the cached measurement of this CPU, under every thread count's name; the folder."""
    folder = gpu_facts._cache_file(str(cache), {"name": "x"}).parent
    folder.mkdir(parents=True)
    for threads in range(1, (os.cpu_count() or 1) + 1):
        facts = {"name": f"cpu ({os.uname().machine})", "threads": threads}
        gpu_facts._cache_file(str(cache), facts).write_text(json.dumps(peaks))
    return folder


def test_peaks_hold_only_while_the_reference_does_not_beat_their_floor():
    assert peaks_hold(2.0, 1.0) and peaks_hold(1.0, 1.0) and peaks_hold(None, 5.0)
    assert not peaks_hold(0.5, 1.0)


@pytest.mark.slow
def test_an_honest_candidate_is_not_flagged_by_a_measured_peak_that_came_out_low(tmp_path, cpu_config):
    problem, cand, cache = _files(tmp_path, MATMUL, CANDIDATE)
    # what a measurement on a loaded machine leaves in the cache
    peaks = _plant_peaks(cache, {"copy_bandwidth_bytes_per_s": 1e6, "matmul_fp32_flops_per_s": 1e6, "matmul_n": 1024})
    before = sorted(p.name for p in peaks.glob("*.json"))
    cfg = cpu_config
    cfg.cache_dir = str(cache)
    r = api.evaluate(problem, cand, config=cfg)
    assert r.status.value == "passed", r.error_log
    assert "faster_than_hardware" not in r.flags()
    physics = r.metadata["guards"].get("facts", {}).get("physics") or r.metadata.get("physics")
    assert isinstance(physics, str) and physics.startswith("not checked: the reference ran in"), physics
    after = sorted(p.name for p in Path(peaks).glob("*.json"))
    assert len(after) == len(before) - 1  # the low measurement the judge read is gone: measured again next time


# A reference that does work its output does not need (the product is multiplied by zero), as
# KernelBench's problems sometimes do; a candidate that skips it is legitimately faster than the
# reference's FLOPs allow. Its floor is what it must write, never what the reference computes.
SKIPPABLE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, c):
        return c + 0.0 * torch.matmul(a, b)


N = 384


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
"""

SKIPPER = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return c.clone()
"""


def test_a_candidate_that_skips_work_the_reference_does_is_not_faster_than_hardware(tmp_path, cpu_config):
    problem, cand, cache = _files(tmp_path, SKIPPABLE, SKIPPER)
    # peaks under which the reference's product (2 N^3 FLOPs) takes 0.2 ms at the least: below the
    # reference's own time on any CPU, far above a copy of c's 0.6 MB at the planted bandwidth
    _plant_peaks(
        cache, {"copy_bandwidth_bytes_per_s": 1e11, "matmul_fp32_flops_per_s": 2 * 384**3 / 0.2e-3, "matmul_n": 1024}
    )
    cfg = cpu_config
    cfg.cache_dir = str(cache)
    r = api.evaluate(problem, cand, config=cfg)
    assert r.status.value == "passed", r.error_log
    physics = r.metadata["guards"].get("facts", {}).get("physics") or r.metadata.get("physics")
    assert isinstance(physics, dict), physics  # checked: the peaks held
    assert "faster_than_hardware" not in r.flags(), r.flags()
    # the floor is c's bytes written at the planted bandwidth
    assert physics["floor_ms"] == pytest.approx(384 * 384 * 4 / 1e11 * 1e3)
