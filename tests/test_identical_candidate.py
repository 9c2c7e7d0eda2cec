"""A candidate that is the reference's own code never gets a trusted speed-up outside 0.8-1.25x.

The speed-up's first duty: nothing, timed twice, is nothing. Where the machine is too busy to tell
(CI's two shared cores), the record must say so (`timing_unstable`: the speed-up is not trusted)
rather than publish a speed-up or a slow-down that the code does not have. Timed with the default
timing protocol, as a user's `kernelwright eval` times it, on problems of different shapes: an
elementwise op of 16 numbers (the fixed costs are all there is), a 256x256 matmul (threads), a
small convolution.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import Status
from kernelwright.engine import evaluate
from kernelwright.engine.config_resolution import resolve_config

PROBLEMS = {
    "tiny_elementwise": """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
def get_inputs():
    return [torch.randn(16)]
def get_init_inputs():
    return []
""",
    "matmul_256": """
import torch
class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.randn(256, 256), torch.randn(256, 256)]
def get_init_inputs():
    return []
""",
    "conv_relu": """
import torch
class Model(torch.nn.Module):
    def __init__(self, c_in, c_out, k):
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, c_out, k)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.randn(4, 8, 32, 32)]
def get_init_inputs():
    return [8, 16, 3]
""",
}

# the way an LLM hands back "no change": the reference's file, with ModelNew bound to its Model
AS_ALIAS = "\nModelNew = Model\n"
# or a subclass that only calls its parent
AS_SUBCLASS = "\nclass ModelNew(Model):\n    def forward(self, *args):\n        return super().forward(*args)\n"


@pytest.mark.parametrize(
    ("name", "tail"),
    [("tiny_elementwise", AS_ALIAS), ("matmul_256", AS_SUBCLASS), ("conv_relu", AS_ALIAS)],
)
def test_the_reference_against_itself_is_never_a_trusted_speedup_outside_the_band(
    name: str, tail: str, tmp_path: Path, cache_dir: str
) -> None:
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEMS[name])
    candidate = tmp_path / "candidate.py"
    candidate.write_text(PROBLEMS[name] + tail)
    cfg = resolve_config(EvalConfig(device="cpu", trials=2, cache_dir=cache_dir))
    r = evaluate(problem, candidate, cfg)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None and r.speedup > 0
    if r.speedup_trusted:
        assert 0.8 <= r.speedup <= 1.25, (r.speedup, r.metadata.get("timing", {}).get("windows", [])[:2])
    else:  # not trusted: the record says why, in a flag a reader sees
        assert "timing_unstable" in r.flags() or "faster_than_hardware" in r.flags(), r.flags()
