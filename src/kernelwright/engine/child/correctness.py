"""Whether an output is right: the one rule, in one place, beside `compare` (strict allclose) and
`numerics` (the float64 oracle, the calibrated verdict).

- `judge_output`: a trial's verdict (a check's output against the reference, and the oracle where
  there is one) under the configured mode, with the evidence the record keeps.
- `errors` / `slot_errors`: how far an output strays from the reference (normwise, and element by
  element against the output's scale), or None where its structure or non-finite pattern differs.
- `TimedBound`: a timed output is right when it strays no further than the candidate's correct
  trials did (16x room), or than the output dtype's resolution: relative to its own scale, or in
  absolute terms, leaf by leaf (an output whose scale collapses, a ReLU's lone small survivor,
  reads one rounding step as a large relative error). A replayed, skipped or unfinished output
  strays by the size of the output itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kernelwright.engine.child import numerics
from kernelwright.engine.child.compare import CompareReport, compare_outputs, flatten, structure_mismatch

if TYPE_CHECKING:
    from kernelwright.core.config import EvalConfig
    from kernelwright.engine.child.numerics import NumericsReport


@dataclass
class Judgement:
    """One output judged: `passed` and its `message`; `evidence` for the record (the trial's
    `numerics`); `strict` the allclose report (None where the structure differs), `calibrated`
    the oracle's report where the verdict followed it."""

    passed: bool
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    strict: CompareReport | None = None
    calibrated: NumericsReport | None = None
    # the error over what the deciding rule allows, for the worst output (<= 1 passes, about; None:
    # a structural failure, which no draw of inputs decides)
    margin: float | None = None


def judge_output(cand: Any, ref_out: Any, oracle_out: Any, cfg: EvalConfig) -> Judgement:
    """An output against the reference's (and the float64 oracle's, where there is one) under
    the configured verdict mode: `strict` allclose, or `calibrated` (numerics.judge) where the
    oracle's report holds; a structural failure of allclose fails it either way."""
    mismatch = structure_mismatch(cand, ref_out)
    if mismatch:
        return Judgement(False, mismatch, {"strict_passed": False})
    strict = compare_outputs(cand, ref_out, cfg.atol, cfg.rtol)
    rep = None
    if oracle_out is not None:
        rep = numerics.judge(
            cand,
            ref_out,
            oracle_out,
            cfg.atol,
            cfg.rtol,
            cfg.numerics.factor,
            excess_floor=cfg.numerics.excess_floor,  # element-by-element test
            excess_floor_low=cfg.numerics.excess_floor_low,
        )
    evidence: dict[str, Any] = {"strict_passed": strict.passed}
    if rep is not None and rep.ok:
        evidence.update(rep.to_dict())
        evidence["calibrated_passed"] = rep.passed
    use_cal = cfg.verdict == "calibrated" and rep is not None and rep.ok and strict.max_abs_err is not None
    cal = rep if use_cal else None  # the report the verdict follows, when calibrated
    if cal is not None:
        passed, message = cal.passed, cal.message
        structural = [leaf for leaf in strict.leaves if not leaf.passed and leaf.max_abs_err is None]
        if structural:
            passed, message = False, strict.message
    else:
        passed, message = strict.passed, strict.message
    return Judgement(passed, message, evidence, strict, cal, margin(strict, cal))


def margin(strict: CompareReport, cal: NumericsReport | None) -> float | None:
    """How near the deciding rule's edge the worst output lies: allclose's largest
    |c - r| / (atol + rtol |r|); under the calibrated rule, for each output the nearer of its two
    ways to pass (within the tolerance of the oracle, or within `factor` x the float32 reference's
    own error, max-abs and normwise)."""
    if cal is None:
        ratios = [leaf.tol_ratio for leaf in strict.leaves if leaf.tol_ratio is not None]
        return max(ratios) if ratios else None
    worst = 0.0
    for leaf in cal.leaves:
        c, r = leaf.candidate, leaf.reference
        by_factor = max(_over(c.max_abs, cal.factor * r.max_abs), _over(c.norm_rel, cal.factor * r.norm_rel))
        worst = max(worst, min(c.tol_ratio, by_factor))
    return worst


def _over(value: float, allowed: float) -> float:
    if allowed > 0 and math.isfinite(allowed):
        return value / allowed
    return 0.0 if value == 0 else math.inf


STACKED_CHECK_BYTES = 256 << 20  # the stacked check's float64 temporaries, at most (per chunk of slots)


def slot_errors(cands: list[Any], refs: list[Any], stacked: bool | None = None) -> list[tuple[float, float] | None]:
    """`errors` of every slot (None for a slot that cannot be compared or raised): with `stacked`,
    at once over the stacked slots where every output is the same floating-point leaves (a few
    tensor operations, not a dozen and four synchronisations per slot), in chunks whose float64
    temporaries stay under STACKED_CHECK_BYTES (a window of 128 MB outputs would need tens of GB at
    once); otherwise, and where the slots cannot be stacked, one slot at a time with `errors`.
    `stacked` None: stacked on an accelerator, one slot at a time on a CPU, where a slot costs no
    synchronisation and `errors` works in the leaf's own precision (a tenth of the stacked float64
    check's time: benchmarks/slot_check.py)."""
    leaves = [x for _, x in flatten(refs[0]) if isinstance(x, torch.Tensor)] if refs else []
    if stacked is None:
        stacked = any(x.device.type != "cpu" for x in leaves)
    if not stacked:
        return _one_by_one(cands, refs)
    per_slot = sum(x.numel() for x in leaves)
    chunk = max(1, STACKED_CHECK_BYTES // max(1, 6 * 8 * per_slot))  # ~6 float64 temporaries an element
    batched: list[tuple[float, float] | None] | None = []
    for i in range(0, len(refs), chunk):
        try:
            part = _errors_stacked(cands[i : i + chunk], refs[i : i + chunk])
        except Exception:
            part = None
        if part is None or batched is None:
            batched = None
            break
        batched += part
    if batched is not None:
        return batched
    return _one_by_one(cands, refs)


def _one_by_one(cands: list[Any], refs: list[Any]) -> list[tuple[float, float] | None]:
    out: list[tuple[float, float] | None] = []
    for c, r in zip(cands, refs, strict=True):
        try:
            out.append(errors(c, r))
        except Exception:
            out.append(None)
    return out


def _errors_stacked(cands: list[Any], refs: list[Any]) -> list[tuple[float, float] | None] | None:
    if not refs or len(cands) != len(refs):
        return None
    ref_leaves = [[x for _, x in flatten(r)] for r in refs]
    cand_leaves = [[x for _, x in flatten(c)] for c in cands]
    first = ref_leaves[0]
    for r, c, rl, cl in zip(refs, cands, ref_leaves, cand_leaves, strict=True):
        if structure_mismatch(c, r) or len(rl) != len(first) or len(cl) != len(first):
            return None
        for x, y, f in zip(rl, cl, first, strict=True):
            ok = (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.is_floating_point()
                and x.shape == f.shape
                and y.shape == x.shape
                and x.dtype == f.dtype
            )
            if not ok:
                return None
    n = len(refs)
    dev = first[0].device if first else torch.device("cpu")
    norm = torch.zeros(n, dtype=torch.float64, device=dev)
    elem = torch.zeros(n, dtype=torch.float64, device=dev)
    bad = torch.zeros(n, dtype=torch.bool, device=dev)
    for j in range(len(first)):
        r64 = torch.stack([rl[j] for rl in ref_leaves]).to(torch.float64).reshape(n, -1)
        c64 = torch.stack([cl[j].to(r64.device) for cl in cand_leaves]).to(torch.float64).reshape(n, -1)
        if not r64.shape[1]:
            continue
        fin = torch.isfinite(r64)
        bad |= (fin != torch.isfinite(c64)).any(dim=1)
        zero = torch.zeros((), dtype=torch.float64, device=r64.device)
        d = torch.where(fin, c64 - r64, zero)
        rf = torch.where(fin, r64, zero)
        one = torch.ones((), dtype=torch.float64, device=r64.device)
        scale = torch.linalg.vector_norm(rf, dim=1)
        norm = torch.maximum(norm, torch.linalg.vector_norm(d, dim=1) / torch.where(scale > 0, scale, one))
        top = rf.abs().amax(dim=1)
        elem = torch.maximum(elem, d.abs().amax(dim=1) / torch.where(top > 0, top, one))
    return [
        None if b else (float(x), float(y)) for b, x, y in zip(bad.tolist(), norm.tolist(), elem.tolist(), strict=True)
    ]


def errors(cand: Any, ref: Any) -> tuple[float, float] | None:
    """(largest normwise relative error, largest element error relative to the output's scale) over
    the leaves, or None where the structure, a shape or the non-finite pattern differs."""
    if structure_mismatch(cand, ref):
        return None
    norm = elem = 0.0
    for (_, c), (_, r) in zip(flatten(cand), flatten(ref), strict=False):
        if not isinstance(r, torch.Tensor):
            if c != r:
                return None
            continue
        if not isinstance(c, torch.Tensor) or c.shape != r.shape:
            return None
        if not (r.is_floating_point() or r.is_complex()):
            if not torch.equal(c.to(r.dtype), r):
                return None
            continue
        got = _leaf_norms(c, r)
        if got is None:
            return None
        dn, dm, rn, rm = got
        norm, elem = max(norm, dn / (rn or 1.0)), max(elem, dm / (rm or 1.0))
    return norm, elem


def _norm_max(x: torch.Tensor) -> tuple[float, float]:
    return float(torch.linalg.vector_norm(x)), float(x.abs().max())


def _working(t: torch.Tensor) -> torch.dtype:
    """The precision a real leaf is measured in: float64 stays float64, the rest in float32 (a
    third of float64's memory traffic, half of it for a temporary of a huge output)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _leaf_norms(c: torch.Tensor, r: torch.Tensor) -> tuple[float, float, float, float] | None:
    """One floating-point leaf, over the reference's finite positions: (norm of c - r, largest
    |c - r|, norm of r, largest |r|); None where the non-finite patterns differ (or one side is
    complex and the other not). In the leaf's working precision where every difference and norm is
    finite (what almost every output is); else exactly, in float64 (complex128). `errors`, the
    trials' bound and `leaf_abs_errors` all measure with this, so the timed check's 16x room sits
    above the same arithmetic."""
    if r.is_complex() != c.is_complex():
        return None
    if not r.numel():
        return 0.0, 0.0, 0.0, 0.0
    if not r.is_complex():
        wd = _working(r)
        rw = r if r.dtype == wd else r.to(wd)
        cw = c if (c.dtype == wd and c.device == r.device) else c.to(device=r.device, dtype=wd)
        d = cw - rw  # non-finite wherever either side is (inf - inf, nan - x): the exact path decides then
        if bool(torch.isfinite(d).all()):
            got = (*_norm_max(d), *_norm_max(rw))
            if all(math.isfinite(v) for v in got):
                return got
    wide = torch.complex128 if r.is_complex() else torch.float64
    r64, c64 = r.to(wide), c.to(device=r.device, dtype=wide)
    fin = torch.isfinite(r64)
    if not torch.equal(fin, torch.isfinite(c64)):  # NaN or Inf where the reference has none, or the reverse
        return None
    zero = torch.zeros((), dtype=wide, device=r64.device)  # (a boolean mask index costs ms on a CPU: where() does not)
    return (*_norm_max(torch.where(fin, c64 - r64, zero)), *_norm_max(torch.where(fin, r64, zero)))


def _finite_norm_max(t: torch.Tensor) -> tuple[float, float]:
    """(norm, largest |element|) of one floating leaf over its finite positions, in its working
    precision where it is finite everywhere and the norm does not overflow, else in float64."""
    if not t.numel():
        return 0.0, 0.0
    if not t.is_complex():
        w = t if t.dtype == _working(t) else t.to(_working(t))
        if bool(torch.isfinite(w).all()):
            got = _norm_max(w)
            if all(math.isfinite(v) for v in got):
                return got
    wide = torch.complex128 if t.is_complex() else torch.float64
    x = t.to(wide)
    return _norm_max(torch.where(torch.isfinite(x), x, torch.zeros((), dtype=wide, device=x.device)))


def resolution(ref: Any) -> float:
    """The coarsest relative resolution among the reference's floating outputs (eps of its dtype)."""
    eps = [torch.finfo(t.dtype).eps for _, t in flatten(ref) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return max(eps, default=0.0)


TIMED_ROOM = 16.0  # how much further than its correct trials a timed output may stray


def leaf_abs_errors(cand: Any, ref: Any) -> tuple[tuple[float, float], ...] | None:
    """For each floating-point tensor leaf of `ref`, in order: (norm of the difference, largest
    element difference) in absolute terms, over the reference's finite positions (`_leaf_norms`).
    None where the structure, a shape or the non-finite pattern differs."""
    if structure_mismatch(cand, ref):
        return None
    out: list[tuple[float, float]] = []
    for (_, c), (_, r) in zip(flatten(cand), flatten(ref), strict=False):
        if not (isinstance(r, torch.Tensor) and (r.is_floating_point() or r.is_complex())):
            continue
        if not isinstance(c, torch.Tensor) or c.shape != r.shape:
            return None
        got = _leaf_norms(c, r)
        if got is None:
            return None
        out.append(got[:2])
    return tuple(out)


def leaf_scales(refs: list[Any]) -> tuple[tuple[float, float], ...] | None:
    """For each floating-point tensor leaf, over outputs `refs` (a window's reference outputs): the
    largest norm and the largest |element| over finite positions (1.0 where all are zero, as
    `errors` takes a zero scale). None where the outputs differ in structure."""
    per: list[list[float]] | None = None
    for r in refs:
        leaves = [t for _, t in flatten(r) if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
        if per is None:
            per = [[0.0, 0.0] for _ in leaves]
        if len(leaves) != len(per):
            return None
        for acc, t in zip(per, leaves, strict=True):
            n, m = _finite_norm_max(t)
            acc[0], acc[1] = max(acc[0], n), max(acc[1], m)
    return None if per is None else tuple((n or 1.0, m or 1.0) for n, m in per)


@dataclass(frozen=True)
class TimedBound:
    """How far a timed output may stray from the reference's output for the same inputs: no
    further than the candidate's correct trials did (`norm_seen`, `elem_seen`, as `errors` gives
    them), with TIMED_ROOM, or than the output dtype's resolution (and `rtol`), relative to the
    output's own scale; or, where that fails, no further in absolute terms, leaf by leaf, than the
    trials did (`abs_seen`, as `leaf_abs_errors` gives them), with TIMED_ROOM, or than the same
    relative bounds allow against the window's scale (`leaf_scales`: where the trials drew only
    zeros, they showed no rounding to go on).

    The second way is for outputs whose scale collapses: after a ReLU behind a large negative shift
    most outputs are all zeros, and one whose lone survivor is 2e-4 reads a one-ulp difference of
    the pre-activation (2.4e-7) as an error of 1e-3 of its scale (about 2 slots in 10,000 of
    CUDA-L1's level 2 problem 9): a timing stage checks over a thousand slots, the correctness
    trials a handful, so only the timed check meets them. Absolute errors no larger than the
    trials' own are the trials' rounding again, whatever the slot's scale; a replayed or skipped
    output still strays by its own values."""

    rtol: float
    norm_seen: float = 0.0
    elem_seen: float = 0.0
    # per floating leaf: the largest (norm, element) absolute difference a correct trial showed
    abs_seen: tuple[tuple[float, float], ...] = ()

    def allows(
        self,
        e: tuple[float, float] | None,
        ref: Any,
        cand: Any = None,
        scales: tuple[tuple[float, float], ...] | None = None,
    ) -> bool:
        """A slot's errors (`errors`: None where structure or non-finite pattern differ) -> right.
        `cand` (the slot's output) is looked at again in absolute terms where the relative test
        fails: against the trials' absolute errors, and, given `scales` (`leaf_scales` of the
        window's reference outputs), by the relative test's own bounds against the window's scale
        rather than the slot's alone (the trials may have drawn nothing but zeros, and shown no
        rounding at all)."""
        if e is None:
            return False
        if self._relative(e[0], e[1], ref, 1.0, 1.0):
            return True
        if cand is None:
            return False
        got = leaf_abs_errors(cand, ref)
        if got is None:
            return False
        seen = self.abs_seen
        if seen and len(got) == len(seen):
            if all(n <= TIMED_ROOM * sn and m <= TIMED_ROOM * sm for (n, m), (sn, sm) in zip(got, seen, strict=True)):
                return True
        return (
            scales is not None
            and len(scales) == len(got)
            and all(self._relative(n, m, ref, sn, sm) for (n, m), (sn, sm) in zip(got, scales, strict=True))
        )

    def _relative(self, norm: float, elem: float, ref: Any, norm_scale: float, elem_scale: float) -> bool:
        """The relative test: errors within TIMED_ROOM times the trials' or the resolution floor,
        each bound times its scale (1: errors already relative to the slot's own)."""
        floor = max(self.rtol, resolution(ref))
        return norm <= max(TIMED_ROOM * self.norm_seen, floor) * norm_scale and elem <= (
            max(TIMED_ROOM * self.elem_seen, 4 * floor) * elem_scale
        )

    def widened(self, e: tuple[float, float] | None, cand: Any = None, ref: Any = None) -> TimedBound:
        """This bound after one more correct trial whose errors were `e` (and, given `cand` and
        `ref`, its absolute errors leaf by leaf)."""
        if e is None:
            return self
        seen = self.abs_seen
        got = leaf_abs_errors(cand, ref) if cand is not None and ref is not None else None
        if got is not None and (not seen or len(seen) == len(got)):
            was = seen or ((0.0, 0.0),) * len(got)
            seen = tuple((max(n, sn), max(m, sm)) for (n, m), (sn, sm) in zip(got, was, strict=True))
        return TimedBound(self.rtol, max(self.norm_seen, e[0]), max(self.elem_seen, e[1]), seen)
