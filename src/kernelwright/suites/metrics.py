"""Suite metrics: pure functions of per-problem outcomes (no I/O, no torch).

One `ProblemOutcome` per problem: its best correct evaluation when it has one (the fastest), else
its last verdict. `fast_p` is KernelBench's: the share of ALL problems whose kernel is correct AND
faster than p times the reference (speedup > p). A correct kernel without a timing (an untimed pass)
counts for p = 0 only, and so does one whose speed-up its record withholds (`timing_unstable`,
`faster_than_hardware`: `speedup_withheld_by`); neither enters the means. Problems whose reference
is flagged degenerate (the `degenerate_reference` guard) are counted apart: they are in `degenerate`
and in no rate, mean or denominator.

`size_robust`: does the problem's kernel hold at every other size of the problem the shapes check
tried (`EvalResult.size_robust`)? True: checked and held everywhere; False: flagged
`shape_specific`; None: not known (not correct, `--shapes off`, sizes that could not be varied).
`fast_p_size_robust` is fast_p with only the kernels whose `size_robust` is True in the numerator,
over the same denominator (all counted problems).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from kernelwright.core.record import RoundVerdict

FAST_P = (0.0, 1.0, 1.5, 2.0)


@dataclass
class ProblemOutcome:
    problem: str
    level: str | None = None
    verdict: RoundVerdict = RoundVerdict.NOT_RUN  # passed when any evaluation passed, else the last round's verdict
    correct: bool = False
    speedup: float | None = None  # of the best correct kernel, over eager
    speedup_vs_compile: float | None = None  # of the same kernel, over torch.compile (when timed)
    speedup_basis: str | None = None  # what `speedup` measures: "device" (the device's timeline) or "host"
    speedup_as_launched: float | None = None  # the calls as launched one at a time, host time included
    # the flags that withhold the kept kernel's speed-up (timing_unstable, faster_than_hardware): the
    # figure is shown, and counts as untimed in fast_p and the means
    speedup_withheld_by: list[str] = field(default_factory=list)
    verdicts: list[RoundVerdict] = field(default_factory=list)  # every round's verdict, in order
    speedups: list[float | None] = field(default_factory=list)  # every round's (None unless passed)
    tokens: int = 0
    cost_usd: float | None = 0.0  # None: some call had no known price
    wall_s: float | None = None
    degenerate: bool = False
    run_id: str | None = None
    best_round: int | None = None
    size_robust: bool | None = None  # the best correct kernel holds at every size tried (None: not known)
    sizes_failed: list[str] = field(default_factory=list)  # the sizes it failed at, when flagged
    speedup_draws: list[float] = field(default_factory=list)  # --draws: each draw's (`speedup` is their median)

    @property
    def counted_speedup(self) -> float | None:
        """The speed-up fast_p and the means count: a correct kernel's figure that its record does not
        withhold (None: incorrect, untimed, or withheld)."""
        return self.speedup if self.correct and not self.speedup_withheld_by else None


@dataclass
class SuiteMetrics:
    problems: int  # counted problems (degenerate ones apart)
    degenerate: list[str]
    correct: int
    correctness_rate: float
    verdict_mix: dict[str, int]  # final verdict per counted problem
    evaluation_mix: dict[str, int]  # every evaluation of the counted problems
    mean_speedup: float | None  # over the correct kernels with a timing
    geomean_speedup: float | None
    mean_speedup_vs_compile: float | None
    geomean_speedup_vs_compile: float | None
    fast_p: dict[str, float]  # "0", "1", "1.5", "2" -> share of all counted problems
    size_robust: int  # correct kernels that hold at every size the shapes check tried
    size_specific: int  # correct kernels wrong at some other size (flagged shape_specific)
    size_unchecked: int  # correct kernels whose other sizes were not checked
    fast_p_size_robust: dict[str, float]  # fast_p counting only size-robust kernels, same denominator
    speedups_withheld: list[str]  # correct kernels whose speed-up the record withholds: counted as untimed
    tokens_per_problem: float
    cost_per_problem: float | None
    wall_s_per_problem: float | None

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def fast_p(outcomes: list[ProblemOutcome], p: float, size_robust: bool = False) -> float:
    """Share of all problems with a correct kernel whose speedup exceeds p (KernelBench's fast_p).
    `size_robust`: count only kernels known to hold at every size tried; the denominator stays all problems."""
    if not outcomes:
        return 0.0
    hits = sum(
        1
        for o in outcomes
        if o.correct
        and (not size_robust or o.size_robust is True)
        and (p == 0 or (o.counted_speedup is not None and o.counted_speedup > p))
    )
    return hits / len(outcomes)


def fast_p_curve(outcomes: list[ProblemOutcome], ps: list[float], size_robust: bool = False) -> list[float]:
    return [fast_p(outcomes, p, size_robust) for p in ps]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def geomean(values: list[float]) -> float | None:
    """Geometric mean of the (positive) speedups; None for none."""
    positive = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in positive) / len(positive)) if positive else None


def _p_key(p: float) -> str:
    return f"{p:g}"


def summarize(outcomes: list[ProblemOutcome]) -> SuiteMetrics:
    counted = [o for o in outcomes if not o.degenerate]
    n = len(counted)
    correct = [o for o in counted if o.correct]
    timed = [s for s in (o.counted_speedup for o in correct) if s is not None]
    trusted = [o for o in correct if not o.speedup_withheld_by]
    vs_compile = [o.speedup_vs_compile for o in trusted if o.speedup_vs_compile is not None]
    costs = [o.cost_usd for o in counted]
    priced = [c for c in costs if c is not None]
    walls = [o.wall_s for o in counted if o.wall_s is not None]
    return SuiteMetrics(
        problems=n,
        degenerate=sorted(o.problem for o in outcomes if o.degenerate),
        correct=len(correct),
        correctness_rate=len(correct) / n if n else 0.0,
        verdict_mix=dict(Counter(str(o.verdict) for o in counted).most_common()),
        evaluation_mix=dict(Counter(str(v) for o in counted for v in o.verdicts).most_common()),
        mean_speedup=mean(timed),
        geomean_speedup=geomean(timed),
        mean_speedup_vs_compile=mean(vs_compile),
        geomean_speedup_vs_compile=geomean(vs_compile),
        fast_p={_p_key(p): fast_p(counted, p) for p in FAST_P},
        size_robust=sum(1 for o in correct if o.size_robust is True),
        size_specific=sum(1 for o in correct if o.size_robust is False),
        size_unchecked=sum(1 for o in correct if o.size_robust is None),
        fast_p_size_robust={_p_key(p): fast_p(counted, p, size_robust=True) for p in FAST_P},
        speedups_withheld=sorted(o.problem for o in correct if o.speedup_withheld_by),
        tokens_per_problem=sum(o.tokens for o in counted) / n if n else 0.0,
        cost_per_problem=(sum(priced) / n if len(priced) == len(costs) else None) if n else None,
        wall_s_per_problem=mean(walls),
    )
