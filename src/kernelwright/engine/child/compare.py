"""Comparing candidate outputs with reference outputs (strict mode: the seed pipeline's allclose).

An output may be a tensor, a number, or a (nested) tuple/list/dict of them; both sides are
flattened into named leaves ("out", "out[1]", "out['y']") and compared leaf by leaf: structure,
shape, dtype, NaN/Inf, then `|cand - ref| <= atol + rtol * |ref|`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.engine.child.wire import Opaque


@dataclass
class LeafReport:
    name: str
    passed: bool
    message: str = ""
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    worst_index: list[int] | None = None
    frac_out_of_tol: float | None = None
    numel: int = 0
    tol_ratio: float | None = None  # the largest |c - r| / (atol + rtol |r|): allclose passes at <= 1


@dataclass
class CompareReport:
    passed: bool
    message: str
    leaves: list[LeafReport] = field(default_factory=list)

    @property
    def max_abs_err(self) -> float | None:
        vals = [l.max_abs_err for l in self.leaves if l.max_abs_err is not None]
        return max(vals) if vals else None

    @property
    def mean_abs_err(self) -> float | None:
        pairs = [(l.mean_abs_err, l.numel) for l in self.leaves if l.mean_abs_err is not None]
        total = sum(n for _, n in pairs)
        return sum(m * n for m, n in pairs) / total if total else None

    @property
    def worst(self) -> LeafReport | None:
        scored = [(l.max_abs_err, l) for l in self.leaves if l.max_abs_err is not None]
        return max(scored, key=lambda s: s[0])[1] if scored else None


def flatten(obj: Any, name: str = "out") -> list[tuple[str, Any]]:
    if isinstance(obj, torch.Tensor):
        return [(name, obj)]
    if isinstance(obj, (tuple, list)):
        leaves: list[tuple[str, Any]] = []
        for i, item in enumerate(obj):
            leaves += flatten(item, f"{name}[{i}]")
        return leaves
    if isinstance(obj, dict):
        leaves = []
        for k in obj:
            leaves += flatten(obj[k], f"{name}[{k!r}]")
        return leaves
    return [(name, obj)]


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor leaf of `obj` (as `flatten` finds them)."""
    return sum(t.numel() * t.element_size() for _, t in flatten(obj) if isinstance(t, torch.Tensor))


def describe(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"tensor{tuple(obj.shape)} {str(obj.dtype).replace('torch.', '')}"
    if isinstance(obj, (tuple, list)):
        return f"{type(obj).__name__} of {len(obj)}"
    return type(obj).__name__


def _index(flat_idx: int, shape: torch.Size) -> list[int]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_idx % dim)
        flat_idx //= dim
    return list(reversed(idx))


def edge_ratio(diff: torch.Tensor, tol: torch.Tensor) -> float:
    """How far the worst element sits from the tolerance's edge: max |c - r| / tol (<= 1 passes;
    an element off where its tolerance is 0 counts as infinitely far)."""
    if diff.numel() == 0:
        return 0.0
    over = torch.where(tol > 0, diff / tol.clamp_min(torch.finfo(torch.float64).tiny), diff * math.inf)
    return float(torch.nan_to_num(over, nan=0.0, posinf=math.inf).max().item())


def compare_tensors(name: str, cand: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> LeafReport:
    if cand.shape != ref.shape:
        return LeafReport(name, False, f"Output shape mismatch in {name}: Expected {ref.shape}, got {cand.shape}")
    if cand.dtype != ref.dtype:
        return LeafReport(
            name,
            False,
            f"Output dtype mismatch in {name}: Expected {str(ref.dtype).replace('torch.', '')}, "
            f"got {str(cand.dtype).replace('torch.', '')}",
        )
    numel = ref.numel()
    if numel == 0:
        return LeafReport(name, True, numel=0, max_abs_err=0.0, mean_abs_err=0.0, frac_out_of_tol=0.0)
    c = cand.detach().to(torch.float64) if not cand.is_complex() else cand.detach().to(torch.complex128)
    r = ref.detach().to(torch.float64) if not ref.is_complex() else ref.detach().to(torch.complex128)
    if c.device != r.device:
        c = c.to(r.device)

    nan_bad = inf_bad = None
    if bool(torch.isfinite(c).all()) and bool(torch.isfinite(r).all()):  # the common case, in fewer passes
        diff = (c - r).abs()
        tol = atol + rtol * r.abs()
        out_of_tol = diff > tol
        ratio = edge_ratio(diff, tol)
    else:  # non-finite values must sit where the reference has the same non-finite value
        c_nan, r_nan = torch.isnan(c), torch.isnan(r)
        c_inf, r_inf = torch.isinf(c), torch.isinf(r)
        nan_bad = c_nan & ~r_nan
        inf_bad = c_inf & ~(r_inf & (c == r))
        diff = (c - r).abs()
        finite_both = torch.isfinite(c) & torch.isfinite(r)
        diff = torch.where(finite_both, diff, torch.zeros_like(diff))
        tol = atol + rtol * r.abs().where(finite_both, torch.zeros_like(diff))
        out_of_tol = (diff > tol) | nan_bad | inf_bad | (r_nan & ~c_nan) | (r_inf & ~c_inf)
        mismatched = bool((nan_bad | inf_bad | (r_nan & ~c_nan) | (r_inf & ~c_inf)).any())
        ratio = math.inf if mismatched else edge_ratio(diff, tol)
    n_bad = int(out_of_tol.sum().item())
    max_abs = float(diff.max().item())
    mean_abs = float(diff.mean().item())
    worst_flat = int(diff.reshape(-1).argmax().item())
    worst_index = _index(worst_flat, ref.shape)
    report = LeafReport(
        name,
        n_bad == 0,
        max_abs_err=max_abs,
        mean_abs_err=mean_abs,
        worst_index=worst_index,
        frac_out_of_tol=n_bad / numel,
        numel=numel,
        tol_ratio=ratio,
    )
    if n_bad == 0:
        return report
    if nan_bad is not None and inf_bad is not None:  # some values were not finite
        n_nan, n_inf = int(nan_bad.sum().item()), int(inf_bad.sum().item())
        if n_nan or n_inf:
            first = int((nan_bad | inf_bad).reshape(-1).nonzero()[0].item())
            report.message = (
                f"Output {name} has {n_nan} NaN and {n_inf} Inf values where the reference is finite "
                f"(first at index {tuple(_index(first, ref.shape))}). "
            )
            worst_index = report.worst_index = _index(first, ref.shape)
    report.message += (
        f"Outputs are not close (atol={atol}, rtol={rtol}). max_abs_err={max_abs:.3e}, mean_abs_err={mean_abs:.3e}"
    )
    cval = c.reshape(-1)[worst_flat].item()
    rval = r.reshape(-1)[worst_flat].item()
    report.message += (
        f"\n  worst element: {name}{tuple(worst_index)} candidate={cval:.6g} reference={rval:.6g}; "
        f"{n_bad}/{numel} elements ({100.0 * n_bad / numel:.3g}%) out of tolerance"
    )
    return report


def skeleton(obj: Any) -> str:
    """The output's structure: `T` for a tensor, `(..)`/`[..]` for sequences, `{k: ..}` for dicts,
    the type's name for anything else. Tuples and lists are the same sequence here."""
    if isinstance(obj, torch.Tensor):
        return "T"
    if isinstance(obj, (tuple, list)):
        return "(" + ", ".join(skeleton(o) for o in obj) + ")"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {skeleton(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (bool, int, float, complex)):
        return "number"
    return type(obj).__name__


def structure_mismatch(cand: Any, ref: Any) -> str:
    """'' when the candidate returns what the reference returns, container for container; else
    one line saying what differs (a tensor is not a one-element tuple of a tensor)."""
    opaque = [name for name, x in flatten(cand) if isinstance(x, Opaque)]
    if opaque:
        leaf = dict(flatten(cand))[opaque[0]]
        return (
            f"Output {opaque[0]} is a {leaf.type_name}, not a plain value: return plain torch.Tensor outputs "
            "(no subclasses, no custom objects)"
        )
    s_c, s_r = skeleton(cand), skeleton(ref)
    if s_c != s_r:
        return (
            f"Output structure mismatch: the reference returns {describe(ref)} ({s_r}), "
            f"the candidate returns {describe(cand)} ({s_c})"
        )
    return ""


def compare_outputs(cand: Any, ref: Any, atol: float, rtol: float) -> CompareReport:
    c_leaves, r_leaves = flatten(cand), flatten(ref)
    if len(c_leaves) != len(r_leaves):
        return CompareReport(
            False,
            f"Output structure mismatch: reference returns {describe(ref)} ({len(r_leaves)} values), "
            f"candidate returns {describe(cand)} ({len(c_leaves)} values)",
        )
    leaves: list[LeafReport] = []
    for (rname, r), (_, c) in zip(r_leaves, c_leaves, strict=False):
        if isinstance(r, torch.Tensor) or isinstance(c, torch.Tensor):
            if not (isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor)):
                leaves.append(
                    LeafReport(rname, False, f"Output {rname}: reference is {describe(r)}, candidate is {describe(c)}")
                )
                continue
            leaves.append(compare_tensors(rname, c, r, atol, rtol))
        elif isinstance(r, (int, float, bool, complex)) and isinstance(c, (int, float, bool, complex)):
            leaves.append(
                compare_tensors(
                    rname, torch.tensor(c, dtype=torch.float64), torch.tensor(r, dtype=torch.float64), atol, rtol
                )
            )
        else:
            ok = r == c
            leaves.append(
                LeafReport(rname, bool(ok), "" if ok else f"Output {rname} differs: expected {r!r}, got {c!r}")
            )
    failed = [l for l in leaves if not l.passed]
    message = "\n".join(l.message for l in failed)
    return CompareReport(not failed, message, leaves)
