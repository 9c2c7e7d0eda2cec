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


@pytest.mark.parametrize(
    ("text", "clocks"),
    [
        (  # CUDA-L1's level1/60: events around its own calls, at its first call
            "start = torch.cuda.Event(enable_timing=True)\nend = torch.cuda.Event(enable_timing=True)\n"
            "start.record()\ny = self.conv3d(x)\nend.record()\ntorch.cuda.synchronize()\n"
            "standard_time = start.elapsed_time(end)\n",
            ["torch.cuda.Event.elapsed_time"],
        ),
        ("import time\nt0 = time.time()\nself.use_mixed = time.time() - t0 < 1\n", ["time.time"]),
        ("from time import perf_counter as pc\nt0 = pc()\n", ["time.perf_counter"]),
        ("import time as clock\nclock.monotonic_ns()\ntime_left = 3\n", ["time.monotonic_ns"]),
        ("from triton.testing import do_bench\nms = do_bench(lambda: f(x))\n", ["triton.testing.do_bench"]),
        ("import torch.utils.benchmark as b\nb.Timer(stmt='f(x)').timeit(3)\n", ["torch.utils.benchmark.Timer"]),
        # not reads: a clock named in a comment or a string, an event made but never read, a sleep
        ("# we used to time with time.perf_counter()\ndoc = 'start.elapsed_time(end)'\n", []),
        ("import time\ne = torch.cuda.Event(enable_timing=True)\ntime.sleep(0.1)\n", []),
        ("def time():\n    return 3\nx = time()\n", []),  # a function of its own called time
        ("import time\nclock = time.perf_counter\nt0 = clock()\n", ["time.perf_counter"]),  # taken by name
        (
            "from torch.utils import benchmark\nbenchmark.Timer(stmt='f(x)').blocked_autorange()\n",
            ["torch.utils.benchmark.Timer"],
        ),
        ("import threading\nthreading.Timer(1.0, f).start()\n", []),  # another module's Timer: no clock read
        ("self.elapsed_time = 0.0\nself.do_bench = None\n", []),  # attributes of its own, set
        ("class ModelNew(nn.Module:\n", []),  # does not parse: the format check says so, not this
    ],
)
def test_the_clocks_a_candidate_reads_are_found_in_its_calls_only(text, clocks):
    assert formats.clocks_read(text) == clocks


def test_a_text_nested_too_deeply_to_parse_is_a_syntax_error_to_every_reader():
    """The parser runs out of its stack on 200,000 unary minuses (MemoryError) and on a deep enough
    expression (RecursionError): a candidate so written, or a model's answer, is turned away as bad
    syntax in one line, never a traceback in the caller's process."""
    from kernelwright.models.extract import OutputRuleError, check_rules

    deep = "x = " + "-" * 200_000 + "1\nclass ModelNew:\n    pass\n"
    with pytest.raises(formats.FormatError, match="nested too deeply to parse") as exc:
        formats.check_candidate_text(deep, "c.py")
    assert "\n" not in str(exc.value)
    assert formats.clocks_read(deep) == [] and formats.compiles_at_first_call(deep) is False
    with pytest.raises(OutputRuleError, match="nested too deeply"):
        check_rules(deep, "cuda")
