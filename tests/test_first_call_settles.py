"""A candidate's first call runs as its timed calls run, never under the output checks' guards."""

from __future__ import annotations

from pathlib import Path

from kernelwright.core.record import Status
from kernelwright.engine import evaluate

HERE = Path(__file__).parent
SWISH = HERE / "fixtures" / "problems" / "swish.py"


def test_a_choice_made_on_the_first_call_is_made_outside_the_checks(cpu_config):
    # Were its first call made under deterministic mode, the candidate would keep a path that does a
    # hundred times the reference's work: 0.019x (2-core CPU, 2026-11-29). Made as timed, it is the reference's
    # own computation: about 1x (0.70-0.94x alone on 2 cores; 0.24-4.3x, untrusted, three side by side
    # or beside busy loops). With twenty times the work the slow path read 0.089-0.099x, and one CI
    # run read 0.0996x, against a bound of 0.3: slow path or load, it could not say. Now the bound
    # sits five times below the fast path's worst seen, and 2.6 times above the slow path's figure.
    r = evaluate(SWISH, HERE / "fixtures" / "settle" / "first_call_choice.py", cpu_config)
    assert r.status is Status.PASSED, r.error_log
    assert r.speedup is not None and r.speedup > 0.05, (r.speedup, r.speedup_trusted, r.flags())
