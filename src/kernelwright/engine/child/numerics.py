"""Numerics-aware correctness: a float64 oracle and the `calibrated` verdict (docs/VERDICTS.md).

The oracle is the reference module deep-copied and upcast (floating parameters and buffers,
floating inputs, and the default dtype while it runs), so it computes the same math with
float64 rounding. Against it, both the float32 (or bf16/fp16) reference and the candidate get
an error: max abs, normwise relative ||x - o|| / ||o||, and the share of elements outside
atol + rtol * |o|.

`calibrated`: each output passes when the candidate is within the tolerance of the oracle, or
when its error is no worse than `factor` times the reference's own error, in max abs, normwise,
and element by element: the share of elements whose error exceeds `factor` x max(the
reference's error at that element, the tolerance) may not exceed `factor` x the reference's
share out of tolerance plus a small floor (`excess_share`; a bug that moves most elements far
past the reference's rounding while a few huge elements dominate the max and the norm). A problem
whose reference itself fails the tolerance against the oracle is flagged ill-conditioned: a fixed
tolerance against that reference cannot judge it.

Low-precision outputs (bf16, fp16): the relative tolerance is never finer than one unit in the last
place of the output's dtype (`resolution_rtol`): at rtol 1e-3 even the exact answer rounded to bf16
is out of tolerance at ~58% of the elements, which made every bf16 problem "ill-conditioned" and
the element-by-element allowance (8x that share) larger than 100%, so it could reject nothing. The
element test's floor is larger there (`excess_floor_low`): a bf16 kernel may keep its intermediates
in bf16, and where cancellation amplifies that rounding a few elements land past 8 ulps.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kernelwright.engine.child.compare import edge_ratio, flatten


def _upcast(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.is_complex():
            return obj.detach().to(torch.complex128 if dtype == torch.float64 else torch.complex64)
        if obj.is_floating_point():
            return obj.detach().to(dtype)
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_upcast(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _upcast(v, dtype) for k, v in obj.items()}
    return obj


def resolution_rtol(dtype: torch.dtype, rtol: float) -> float:
    """The relative tolerance an output of `dtype` can be held to: `rtol`, but never finer than one
    unit in the last place of `dtype` (finfo.eps; 2^-7 for bf16): below it, even the exact answer
    correctly rounded to `dtype` fails. float32 and wider: `rtol` unchanged (their eps is far below)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return rtol
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    return max(rtol, float(torch.finfo(real).eps))


def low_precision(dtype: torch.dtype) -> bool:
    """Floating point coarser than float32 (bf16, fp16, the float8 kinds)."""
    return bool(dtype.is_floating_point and torch.finfo(dtype).eps > torch.finfo(torch.float32).eps)


def oracle_dtype(name: str) -> torch.dtype:
    return torch.float64 if name == "float64" else torch.float32


def build_oracle(ref_model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of the reference module with floating parameters and buffers in `dtype`, in the
    reference's own mode (EvalConfig.model_mode)."""
    return copy.deepcopy(ref_model).to(dtype)


def run_oracle(oracle: torch.nn.Module, inputs: Any, dtype: torch.dtype) -> Any:
    """The oracle's output on `inputs` upcast to `dtype` (tensors created inside default to `dtype`)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.no_grad():
            return oracle(*_upcast(inputs, dtype))
    finally:
        torch.set_default_dtype(prev)


@dataclass
class Deviation:
    """How far one output is from the oracle."""

    max_abs: float
    mean_abs: float
    norm_rel: float  # ||x - o|| / ||o|| (||x - o|| when ||o|| is 0)
    frac_out_of_tol: float  # share of elements with |x - o| > atol + rtol * |o| (or non-finite mismatch)
    nonfinite: int  # elements non-finite where the oracle is finite
    tol_ratio: float = 0.0  # the largest |x - o| / (atol + rtol |o|): within the tolerance at <= 1


def deviation(x: torch.Tensor, o: torch.Tensor, atol: float, rtol: float) -> Deviation:
    xd = x.detach().to(o.device, torch.complex128 if o.is_complex() else torch.float64)
    od = o.detach().to(torch.complex128 if o.is_complex() else torch.float64)
    if od.numel() == 0:
        return Deviation(0.0, 0.0, 0.0, 0.0, 0)
    if bool(torch.isfinite(od).all()) and bool(torch.isfinite(xd).all()):  # the common case, in fewer passes
        diff = (xd - od).abs()
        tol = atol + rtol * od.abs()
        bad = diff > tol
        o_norm = float(torch.linalg.vector_norm(od).item())
        n_nf, nf_any = 0, False
    else:
        o_fin = torch.isfinite(od)
        both = o_fin & torch.isfinite(xd)
        # a non-finite value must match the oracle's non-finite value exactly
        nf_bad = (~both) & ~((xd == od) | (torch.isnan(xd) & torch.isnan(od)))
        diff = torch.where(both, (xd - od).abs(), torch.zeros((), dtype=torch.float64, device=od.device))
        tol = atol + rtol * torch.where(o_fin, od.abs(), torch.zeros((), dtype=torch.float64, device=od.device))
        bad = (diff > tol) | nf_bad
        o_norm = float(torch.linalg.vector_norm(torch.where(o_fin, od, torch.zeros_like(od))).item())
        n_nf, nf_any = int((nf_bad & o_fin).sum().item()), bool(nf_bad.any())
    d_norm = float(torch.linalg.vector_norm(diff).item())
    return Deviation(
        max_abs=float(diff.max().item()) if n_nf == 0 else math.inf,
        mean_abs=float(diff.mean().item()) if n_nf == 0 else math.inf,
        norm_rel=(d_norm / o_norm if o_norm > 0 else d_norm) if n_nf == 0 else math.inf,
        frac_out_of_tol=float(bad.sum().item()) / od.numel(),
        nonfinite=n_nf,
        tol_ratio=math.inf if nf_any else edge_ratio(diff, tol),
    )


@dataclass
class LeafNumerics:
    name: str
    reference: Deviation
    candidate: Deviation
    within_tol: bool  # candidate within atol/rtol of the oracle everywhere
    within_factor: bool  # candidate's max-abs and normwise errors <= factor x the reference's
    passed: bool
    excess_share: float = 0.0  # share of elements with |c-o| > factor * max(|r-o|, atol + rtol|o|)
    excess_allowed: float = 0.0  # factor * the reference's share out of tolerance + the floor
    within_distribution: bool = True  # excess_share <= excess_allowed
    rtol: float = 0.0  # the relative tolerance applied to this output (resolution_rtol of its dtype)
    # a failing output: the candidate against the reference, the figures the record's max_abs_err and
    # the strict comparison give (the error log's headline states these, the oracle's on its own line)
    against_reference: Deviation | None = None


@dataclass
class NumericsReport:
    ok: bool  # the oracle could be compared leaf by leaf (structure, shapes and dtypes agree)
    passed: bool = False
    ill_conditioned: bool = False  # the reference itself fails the tolerance against the oracle
    leaves: list[LeafNumerics] = field(default_factory=list)
    message: str = ""
    factor: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "ill_conditioned": self.ill_conditioned,
            "factor": self.factor,
            "leaves": [
                {
                    "name": l.name,
                    "reference": asdict(l.reference),
                    "candidate": asdict(l.candidate),
                    "within_tol": l.within_tol,
                    "within_factor": l.within_factor,
                    "passed": l.passed,
                    "excess_share": l.excess_share,
                    "excess_allowed": l.excess_allowed,
                    "within_distribution": l.within_distribution,
                    "rtol": l.rtol,
                }
                for l in self.leaves
            ],
        }

    def failing(self) -> list[LeafNumerics]:
        return [l for l in self.leaves if not l.passed]


def _leaf_passes(ref: Deviation, cand: Deviation, factor: float) -> tuple[bool, bool]:
    within_tol = cand.frac_out_of_tol == 0.0 and cand.nonfinite == 0
    within_factor = (
        cand.nonfinite == 0
        and math.isfinite(ref.max_abs)
        and cand.max_abs <= factor * ref.max_abs
        and cand.norm_rel <= factor * ref.norm_rel
        and ref.max_abs > 0
    )
    return within_tol, within_factor


def excess_share(
    cand: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor, atol: float, rtol: float, factor: float
) -> float:
    """Share of elements whose error exceeds `factor` x max(the reference's error there, the tolerance).

    Element by element, so it sees a bug that moves most elements while a few huge elements
    dominate the max and the norm. The tolerance is the floor: where the reference happens to be
    exact, the candidate is still allowed `factor` x atol + rtol|o|. Elements where the oracle is
    not finite are left to the non-finite check.
    """
    o = oracle.detach().to(torch.complex128 if oracle.is_complex() else torch.float64)
    if o.numel() == 0:
        return 0.0
    c = cand.detach().to(o.device, o.dtype)
    r = ref.detach().to(o.device, o.dtype)
    fin = torch.isfinite(o) & torch.isfinite(c) & torch.isfinite(r)
    zero = torch.zeros((), dtype=torch.float64, device=o.device)
    ec = torch.where(fin, (c - o).abs(), zero)
    er = torch.where(fin, (r - o).abs(), zero)
    tol = atol + rtol * torch.where(fin, o.abs(), zero)
    return float((ec > factor * torch.maximum(er, tol)).sum().item()) / int(o.numel())


def distribution_allowed(ref: Deviation, factor: float, floor: float) -> float:
    """The share of excess elements a candidate may have: `factor` x the reference's own share
    out of tolerance, plus `floor` (a handful of elements where the reference happens to be exact)."""
    return factor * ref.frac_out_of_tol + floor


def judge(
    cand: Any,
    ref: Any,
    oracle: Any,
    atol: float,
    rtol: float,
    factor: float,
    excess_floor: float = 1e-4,
    excess_floor_low: float = 1e-2,
) -> NumericsReport:
    """The calibrated verdict on one trial's outputs. `ok` False: compare structurally instead.

    Per output, rtol is raised to its dtype's resolution (`resolution_rtol`) and the element test's
    floor is `excess_floor_low` for low-precision outputs, `excess_floor` otherwise."""
    c_leaves, r_leaves, o_leaves = flatten(cand), flatten(ref), flatten(oracle)
    if not (len(c_leaves) == len(r_leaves) == len(o_leaves)):
        return NumericsReport(ok=False)
    report = NumericsReport(ok=True, factor=factor)
    for (name, r), (_, c), (_, o) in zip(r_leaves, c_leaves, o_leaves, strict=False):
        if not isinstance(r, torch.Tensor):
            if isinstance(r, (int, float)) and isinstance(c, (int, float)) and isinstance(o, (int, float)):
                r, c, o = (torch.tensor(float(v), dtype=torch.float64) for v in (r, c, o))
            else:
                continue  # non-numeric leaves: the strict comparison decides them
        if not (isinstance(c, torch.Tensor) and isinstance(o, torch.Tensor)):
            return NumericsReport(ok=False)
        if c.shape != r.shape or c.dtype != r.dtype or o.shape != r.shape:
            return NumericsReport(ok=False)
        if not (r.is_floating_point() or r.is_complex()):
            continue  # integer/bool outputs: exact, the strict comparison decides them
        rt = resolution_rtol(r.dtype, rtol)
        rd = deviation(r, o, atol, rt)
        cd = deviation(c, o, atol, rt)
        within_tol, within_factor = _leaf_passes(rd, cd, factor)
        floor = excess_floor_low if low_precision(r.dtype) else excess_floor
        share, allowed = 0.0, distribution_allowed(rd, factor, floor)
        if not within_tol:  # the element-by-element test only matters for the factor branch
            share = excess_share(c, r, o, atol, rt, factor)
        within_dist = share <= allowed
        passed = within_tol or (within_factor and within_dist)
        report.leaves.append(
            LeafNumerics(
                name,
                rd,
                cd,
                within_tol,
                within_factor,
                passed,
                share,
                allowed,
                within_dist,
                rt,
                None if passed else deviation(c, r, atol, rt),
            )
        )
        if rd.frac_out_of_tol > 0:
            report.ill_conditioned = True
    report.passed = all(l.passed for l in report.leaves)
    if not report.passed:
        report.message = "\n".join(_leaf_message(l, atol, rtol, factor) for l in report.failing())
    return report


def _leaf_message(l: LeafNumerics, atol: float, rtol: float, factor: float) -> str:
    c, r = l.candidate, l.reference
    vs_ref = l.against_reference or c  # the record's max_abs_err measures the candidate against the reference
    head = (
        f"Outputs are not close (atol={atol}, rtol={rtol}). "
        f"max_abs_err={vs_ref.max_abs:.3e}, mean_abs_err={vs_ref.mean_abs:.3e}"
    )
    if l.rtol > rtol:
        head += (
            f" (rtol {l.rtol:.3g} for {l.name}: one unit in the last place of its dtype, the finest "
            f"tolerance its values can meet)"
        )
    if c.nonfinite:
        head = f"Output {l.name} has {c.nonfinite} NaN/Inf values where the oracle is finite. " + head
    lines = [
        head,
        f"  (calibrated check of {l.name} against a float64 oracle: candidate max_abs={c.max_abs:.3e}, "
        f"normwise={c.norm_rel:.3e}, {100 * c.frac_out_of_tol:.3g}% out of tolerance; the reference's own error "
        f"max_abs={r.max_abs:.3e}, normwise={r.norm_rel:.3e}; a pass needs the tolerance, or at most {factor:g}x "
        f"the reference's error in both)",
    ]
    if l.within_factor and not l.within_distribution:
        lines.append(
            f"  (element by element: {100 * l.excess_share:.3g}% of {l.name}'s elements are more than {factor:g}x "
            f"the reference's own error there (and {factor:g}x the tolerance), where at most "
            f"{100 * l.excess_allowed:.3g}% is allowed ({factor:g}x the reference's "
            f"{100 * r.frac_out_of_tol:.3g}% out of tolerance, plus a floor): a few huge elements hide a change "
            f"to most of the others in the max and the norm)"
        )
    return "\n".join(lines)


# Arithmetic in a lower precision leaves every element within a few of that precision's units in
# the last place (ulps) of the output's largest magnitude; a dropped column or a wrong element does not.
LOWER_PRECISION_MAX_ULPS = 8


def lower_precision_suspected(oracle: torch.Tensor, dev: Deviation, out_dtype: torch.dtype) -> bool:
    """A hint: the candidate's error looks like rounding to bf16 or fp16. Both must hold, for one of them:
    the normwise error is at the level of rounding the oracle to it (0.3x to 30x), and the largest
    error is at most LOWER_PRECISION_MAX_ULPS of its ulps at the oracle's largest magnitude. Never
    for an output that is bf16/fp16 itself: that precision is the problem's own choice."""
    if low_precision(out_dtype) or dev.nonfinite or not math.isfinite(dev.norm_rel) or dev.norm_rel == 0:
        return False
    o = oracle.detach().to(torch.float64)
    o_norm = float(torch.linalg.vector_norm(o).item())
    if o_norm == 0 or not math.isfinite(o_norm):
        return False
    top = float(o.abs().max().item())
    for low in (torch.bfloat16, torch.float16):
        rounded = o.to(low).to(torch.float64)
        if not torch.isfinite(rounded).all():
            continue
        level = float(torch.linalg.vector_norm(rounded - o).item()) / o_norm
        ulp = 2.0 ** math.floor(math.log2(top)) * torch.finfo(low).eps
        if level > 0 and 0.3 * level <= dev.norm_rel <= 30 * level and dev.max_abs <= LOWER_PRECISION_MAX_ULPS * ulp:
            return True
    return False
