"""What the engine reads from a candidate's text before running it."""

from __future__ import annotations

import pytest

from kernelwright.core import formats


@pytest.mark.parametrize(
    ("text", "jit"),
    [
        ("import triton\nimport triton.language as tl\n", True),
        ("from triton import language as tl\n", True),
        ("@triton.autotune(configs=[])\n@triton.jit\ndef k(x): pass\n", True),
        ("self.f = torch.compile(self.f)\n", True),
        ("from torch.utils.cpp_extension import load_inline\next = load_inline(name='x', cpp_sources='')\n", False),
        ("import torch\n# tritonic is not triton\nx = 'import triton'\n", False),
    ],
)
def test_a_candidate_that_compiles_at_its_first_call_is_recognised(text, jit):
    assert formats.compiles_at_first_call(text) is jit
