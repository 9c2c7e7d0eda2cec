"""A reference whose output does not depend on its input (`degenerate_reference`).

Some KernelBench problems compute a constant: `min(x, c)` then `clamp(min=c)` is c; a softmax
over an axis of size 1 is 1; `x - x.mean(dim, keepdim=True)` after a max over that axis is 0.
Any kernel that returns the constant is then "correct", and its speed-up (20x to 470x seen)
measures nothing. The detector sees the reference's outputs of the correctness trials: when
every output is identical in every trial although the inputs differ, the reference is
degenerate. It is a fact about the problem, never a failure of the candidate.

Pure functions on tensors: the judge process can run it on outputs it received as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernelwright.engine.child.compare import flatten

WHY = (
    "any kernel that returns this constant is 'correct', so its speed-up measures nothing; "
    "suite speed-up aggregates leave this problem out"
)


@dataclass
class DegenerateFinding:
    degenerate: bool
    reason: str = ""  # one line: what is constant and why the speed-up means nothing


def _tensors(obj: Any) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in flatten(obj) if isinstance(t, torch.Tensor)]


SAMPLE = 4096  # elements kept per tensor, evenly strided, beside whole-tensor sums


@dataclass(frozen=True)
class Fingerprint:
    """What is kept of one tensor of one trial: no copy of the tensor (level-3 inputs are large)."""

    shape: tuple[int, ...]
    dtype: str
    total: float  # sum (float64), NaN mapped to 0
    abs_total: float
    lo: float  # min and max of the finite elements (NaN when none)
    hi: float
    nans: int
    sample: tuple[float, ...]  # up to SAMPLE elements, evenly strided over the flattened tensor


def fingerprint(t: torch.Tensor) -> Fingerprint:
    x = t.detach()
    flat = torch.view_as_real(x.reshape(-1)).reshape(-1) if x.is_complex() else x.reshape(-1)
    n = flat.numel()
    step = max(1, n // SAMPLE)
    if n and flat.is_floating_point() and bool(torch.isfinite(flat).all()):
        # every element finite (the common case): float64 reductions, no float64 copy of the tensor
        lo, hi = torch.aminmax(flat)
        return Fingerprint(
            shape=tuple(x.shape),
            dtype=str(x.dtype),
            total=float(flat.sum(dtype=torch.float64).item()),
            abs_total=float(torch.linalg.vector_norm(flat, 1, dtype=torch.float64).item()),
            lo=float(lo.item()),
            hi=float(hi.item()),
            nans=0,
            sample=tuple(flat[::step][:SAMPLE].to(torch.float64).cpu().tolist()),
        )
    d = flat.to(torch.float64)
    nan = torch.isnan(d)
    fin = d[torch.isfinite(d)]
    clean = torch.nan_to_num(d, nan=0.0)
    return Fingerprint(
        shape=tuple(x.shape),
        dtype=str(x.dtype),
        total=float(clean.sum().item()) if n else 0.0,
        abs_total=float(clean.abs().sum().item()) if n else 0.0,
        lo=float(fin.min().item()) if fin.numel() else float("nan"),
        hi=float(fin.max().item()) if fin.numel() else float("nan"),
        nans=int(nan.sum().item()),
        sample=tuple(clean[::step][:SAMPLE].cpu().tolist()),
    )


def _extremes(f: Fingerprint) -> tuple[float | str, ...]:
    return tuple("nan" if v != v else v for v in (f.lo, f.hi))


def _same(a: Fingerprint, b: Fingerprint) -> bool:
    """Equal fingerprints (NaN extremes compare equal: all-NaN tensors alike)."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.total == b.total
        and a.abs_total == b.abs_total
        and a.nans == b.nans
        and a.sample == b.sample
        and _extremes(a) == _extremes(b)
    )


def alike(a: list[Fingerprint], b: list[Fingerprint]) -> bool:
    """Two outputs' fingerprints, tensor by tensor, equal (`_same`)."""
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


class DegenerateDetector:
    """Fed one trial at a time (inputs, the reference's outputs); `finding()` after two or more.

    Keeps fingerprints (sums, extremes and a strided sample), never copies of the tensors: equal
    output fingerprints in every trial while the inputs' fingerprints differ is a reference that
    does not depend on its input."""

    def __init__(self) -> None:
        self.first_inputs: list[Fingerprint] | None = None
        self.first_outputs: list[tuple[str, Fingerprint]] | None = None
        self.trials = 0
        self.inputs_differ = False
        self.outputs_identical = True

    def add(self, inputs: Any, outputs: Any) -> None:
        ins = [fingerprint(t) for _, t in _tensors(inputs)]
        outs = [(n, fingerprint(t)) for n, t in _tensors(outputs)]
        self.trials += 1
        first_inputs, first_outputs = self.first_inputs, self.first_outputs
        if first_inputs is None or first_outputs is None:  # the first trial (both are set together)
            self.first_inputs, self.first_outputs = ins, outs
            return
        if len(ins) != len(first_inputs) or any(not _same(a, b) for a, b in zip(ins, first_inputs, strict=False)):
            self.inputs_differ = True
        if len(outs) != len(first_outputs) or any(
            not _same(a, b) for (_, a), (_, b) in zip(outs, first_outputs, strict=False)
        ):
            self.outputs_identical = False

    def finding(self) -> DegenerateFinding:
        return judge_degenerate(self.trials, self.inputs_differ, self.outputs_identical, self.first_outputs or [])


def judge_degenerate(
    trials: int, inputs_differ: bool, outputs_identical: bool, outputs: list[tuple[str, Fingerprint]]
) -> DegenerateFinding:
    """Degenerate when the outputs of `trials` (>= 2) trials with different inputs are identical."""
    if trials < 2 or not inputs_differ or not outputs_identical or not outputs:
        return DegenerateFinding(False)
    what = []
    for name, f in outputs[:3]:
        if f.nans == 0 and f.lo == f.hi:
            what.append(f"{name} is the constant {f.lo:.6g} in every element (shape {f.shape})")
        else:
            what.append(f"{name} (shape {f.shape}) is the same tensor")
    reason = (
        f"the reference's output does not depend on its input: in {trials} trials with different inputs "
        f"{'; '.join(what)}; {WHY}"
    )
    return DegenerateFinding(True, reason)


def detect(trials: list[tuple[Any, Any]]) -> DegenerateFinding:
    """`trials`: (inputs, reference outputs) per trial."""
    d = DegenerateDetector()
    for inputs, outputs in trials:
        d.add(inputs, outputs)
    return d.finding()


def identical(a: Any, b: Any) -> bool:
    """Whether two outputs are the same, element for element (NaN equal to NaN): the timing stage's
    test of whether the reference's outputs of its draws differ (`judge_degenerate`'s other evidence)."""
    fa, fb = flatten(a), flatten(b)
    if len(fa) != len(fb):
        return False
    for (_, x), (_, y) in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y:
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            return False
        if torch.equal(x, y):
            continue
        floating = x.is_floating_point() or x.is_complex()
        if not floating or not torch.allclose(x, y, rtol=0.0, atol=0.0, equal_nan=True):
            return False
    return True
