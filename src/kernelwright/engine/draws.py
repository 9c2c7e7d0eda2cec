"""Several draws of one evaluation, one record (`TimingConfig.draws`).

A side's time per call is steady inside one process (its windows agree to about 0.1%) but moves from
one process to the next (small sides 2.7% apart, p90 6.1%: docs/PERFORMANCE.md, "Run to run"): where the
driver put its memory, which GPU of the machine it ran on, the host's pace. More windows cannot average
that; evaluations in other processes can. Each draw is a whole evaluation (build, every check, timing),
never a process that only times: such a process is one a candidate could tell apart and answer fast.

The rules, for `combine`:
- every draw must pass: the first draw that does not (or has no speed-up) is the record, as it came;
- otherwise the record is the draw whose speed-up is the median (the lower of the two middle ones for an
  even count: the figure a user may take for granted is never the optimistic one);
- every draw's flags are the record's: a finding in any process stands (a speed-up one draw withholds,
  `timing_unstable` included, stays withheld);
- what only the first draw gathers (the profile, the sanitizer's run: the others skip them) stays;
- `metadata["draws"]` keeps each draw's figures, so a reader sees the spread the median came from.
"""

from __future__ import annotations

from typing import Any

from kernelwright.core.record import EvalResult, Status


def settled(draws: list[EvalResult]) -> bool:
    """No draw after these would change the record: one failed, or had no speed-up to take a median of."""
    last = draws[-1]
    return last.status is not Status.PASSED or last.speedup is None


def wanted(draws: list[EvalResult], asked: int) -> bool:
    """Another draw is to be made."""
    return len(draws) < asked and not settled(draws)


def summary(result: EvalResult) -> dict[str, Any]:
    """One draw's figures, as `metadata["draws"]` keeps them."""
    return {
        "status": result.status.value,
        "speedup": result.speedup,
        "reference_ms": result.reference_ms,
        "candidate_ms": result.candidate_ms,
        "speedup_trusted": result.speedup_trusted,
        "flags": sorted(result.flags()),
        "total_s": result.stage_times.total_s,
        "spans": dict(result.stage_times.spans),  # its stages on the parent's clock (suites/accounting.py)
    }


def combine(draws: list[EvalResult], asked: int) -> EvalResult:
    """The record of `draws` (in the order they ran), `asked` of them asked for (module docstring)."""
    if not draws:
        raise ValueError("combine needs at least one draw")
    if settled(draws):
        at = len(draws) - 1
    else:
        ranked = sorted(range(len(draws)), key=lambda i: draws[i].speedup or 0.0)
        at = ranked[(len(ranked) - 1) // 2]
    chosen = draws[at]
    record = EvalResult.from_dict(chosen.to_dict())  # a copy: the draws stay as they ran
    if at != 0:  # what only the first draw gathers (its profile, its sanitizer's run) stays in the record
        for key, value in draws[0].metadata.items():
            record.metadata.setdefault(key, value)
        if record.stage_times.profile_s is None:
            record.stage_times.profile_s = draws[0].stage_times.profile_s
    if len(draws) > 1:
        flags: dict[str, str] = {}
        for i, r in enumerate(draws):
            if i != at:
                flags.update({k: f"(draw {i + 1}) {v}" for k, v in r.flags().items()})
        flags.update(chosen.flags())  # its own words where it raised the same flag
        guards = record.metadata.setdefault("guards", {})
        guards["flags"] = flags
    speedups = [r.speedup for r in draws if r.status is Status.PASSED and r.speedup]
    record.metadata["draws"] = {
        "asked": asked,
        "ran": len(draws),
        "chosen": at + 1,
        "spread": round(max(speedups) / min(speedups) - 1, 4) if len(speedups) > 1 else None,
        "each": [summary(r) for r in draws],
    }
    return record
