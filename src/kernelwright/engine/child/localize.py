"""Failure localisation: plain-line facts about a wrong output, for the Judge (no model needed).

Given a candidate output and the output it should equal (the float64 oracle, or the reference),
say where and how they differ: the share out of tolerance and the first bad index; NaN/Inf and
where they start (and whether they are memory filled with NaN that the candidate never wrote);
the error profile along each axis ("errors only at positions >= 64 along dim 1"); and structural
matches: the output equals the target with two axes swapped, with a dimension flattened in the
wrong factor order ((l c) vs (c l)), shifted by one along an axis, scaled or offset by a
constant, or left at zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

MAX_STRUCTURAL_NUMEL = 1 << 26  # skip the structural search on larger outputs
MAX_FACTORISATIONS = 12
STRUCTURAL_BUDGET_S = 1.5  # wall-clock budget for the structural search of one output


def _idx(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    """Normwise relative distance ||x - y|| / ||y||, over finite elements of both."""
    fin = torch.isfinite(x) & torch.isfinite(y)
    if not bool(fin.any()):
        return math.inf
    d = float(torch.linalg.vector_norm(torch.where(fin, x - y, torch.zeros_like(x))).item())
    n = float(torch.linalg.vector_norm(torch.where(fin, y, torch.zeros_like(y))).item())
    if int(fin.sum().item()) < 0.99 * fin.numel():
        return math.inf
    return d / n if n > 0 else d


def _positions(mask: torch.Tensor) -> str | None:
    """Describe the set of positions (a 1-D bool mask) that hold errors, or None when all do."""
    n = mask.numel()
    pos = mask.nonzero().flatten().tolist()
    if not pos or len(pos) == n:
        return None
    a, b = pos[0], pos[-1]
    if len(pos) == b - a + 1:
        if a > 0 and b == n - 1:
            return f"only at positions >= {a}"
        if a == 0:
            return f"only at positions < {b + 1}"
        return f"only at positions {a}..{b}"
    if len(pos) <= 6:
        return "only at positions " + ", ".join(map(str, pos))
    steps = {q - p for p, q in zip(pos, pos[1:], strict=False)}
    if len(steps) == 1:
        s = steps.pop()
        return f"only at every {s}th position, from {a} to {b} ({len(pos)} positions)"
    return f"at {len(pos)} of {n} positions (first {a}, last {b})"


def _axis_profile(bad: torch.Tensor) -> list[str]:
    lines = []
    for d, n in enumerate(bad.shape):
        if n <= 1:
            continue
        per_pos = bad.movedim(d, 0).reshape(n, -1).any(dim=1)
        desc = _positions(per_pos.cpu())
        if desc:
            lines.append(f"errors {desc} along dim {d} (size {n})")
    return lines


def _factor_pairs(n: int) -> list[tuple[int, int]]:
    pairs = [(a, n // a) for a in range(2, n) if n % a == 0]
    return pairs[:MAX_FACTORISATIONS]


def _structural(c: torch.Tensor, t: torch.Tensor, direct: float) -> list[str]:
    """Transformations of the target that the candidate matches far better than the target itself."""
    shape = t.shape
    thr = max(1e-9, min(1e-3, 0.01 * direct))
    found: list[str] = []
    deadline = time.monotonic() + STRUCTURAL_BUDGET_S

    def close(x: torch.Tensor, y: torch.Tensor) -> bool:
        if time.monotonic() > deadline:
            return False  # out of budget: report what was found so far
        # normwise close, and close element by element almost everywhere (a normwise match alone
        # can come from a few huge elements)
        if _rel(x, y) > thr:
            return False
        near = (x - y).abs() <= 1e-2 * y.abs() + 1e-6
        return float(near.float().mean().item()) >= 0.9

    # a constant factor or offset
    tt = float((t * t).sum().item())
    if tt > 0:
        alpha = float((c * t).sum().item()) / tt
        if math.isfinite(alpha) and abs(alpha - 1) > 1e-6 and close(c, alpha * t):
            found.append(f"the output equals the reference times {alpha:.6g} (a constant factor)")
    beta = float((c - t).mean().item())
    if not found and math.isfinite(beta) and beta != 0 and close(c - beta, t):
        found.append(f"the output equals the reference plus {beta:.6g} (a constant offset)")

    # two axes swapped (equal sizes), or swapped and then reshaped to the output's shape
    nd = len(shape)
    for i in range(nd):
        for j in range(i + 1, nd):
            if shape[i] == 1 or shape[j] == 1:
                continue
            swapped = t.transpose(i, j).contiguous()
            if shape[i] == shape[j]:
                if close(c, swapped):
                    found.append(
                        f"the output equals the reference with axes {i} and {j} swapped (dims {i} and {j} transposed)"
                    )
            elif close(c, swapped.reshape(shape)):
                found.append(
                    f"the output holds the reference's values laid out with axes {i} and {j} swapped, then reshaped to "
                    f"{tuple(shape)}: the memory order of dims {i} and {j} is wrong"
                )

    # one dimension flattened from two factors in the wrong order: (a b) vs (b a)
    for d, n in enumerate(shape):
        for a, b in _factor_pairs(n):
            reordered = t.unflatten(d, (a, b)).transpose(d, d + 1).flatten(d, d + 1)
            if close(c, reordered):
                found.append(
                    f"along dim {d} (size {n} = {a} x {b}) the output holds the reference's elements in the wrong "
                    f"order: its element j*{a} + i is the reference's i*{b} + j, a reshape with the two factors "
                    f"swapped (e.g. '(c l)' where '(l c)' was meant, sizes {a} and {b})"
                )

    # shifted by one along an axis (compared on the overlap)
    for d, n in enumerate(shape):
        if n < 3:
            continue
        if close(c.narrow(d, 1, n - 1), t.narrow(d, 0, n - 1)):
            found.append(
                f"the output equals the reference shifted by +1 along dim {d}: out[i] = ref[i-1] "
                f"(an off-by-one index along dim {d})"
            )
        elif close(c.narrow(d, 0, n - 1), t.narrow(d, 1, n - 1)):
            found.append(
                f"the output equals the reference shifted by -1 along dim {d}: out[i] = ref[i+1] "
                f"(an off-by-one index along dim {d})"
            )
    return found


def localize(
    cand: torch.Tensor, target: torch.Tensor, atol: float, rtol: float, name: str = "out", nan_filled: bool = False
) -> list[str]:
    """Plain lines saying where and how `cand` differs from `target` (same shape)."""
    if cand.shape != target.shape or target.numel() == 0:
        return []
    if cand.is_complex() or target.is_complex():
        c, t = (
            torch.view_as_real(cand.detach().to(torch.complex128)),
            torch.view_as_real(target.detach().to(torch.complex128)),
        )
    else:
        c = cand.detach().to(target.device, torch.float64)
        t = target.detach().to(torch.float64)
    shape = t.shape
    t_fin = torch.isfinite(t)
    c_fin = torch.isfinite(c)
    nonfinite = t_fin & ~c_fin
    diff = torch.where(t_fin & c_fin, (c - t).abs(), torch.zeros_like(t))
    bad = (
        (diff > atol + rtol * torch.where(t_fin, t.abs(), torch.zeros_like(t)))
        | nonfinite
        | (~t_fin & (c != t) & ~(torch.isnan(c) & torch.isnan(t)))
    )
    n_bad, numel = int(bad.sum().item()), t.numel()
    if n_bad == 0:
        return []
    lines = []
    first = int(bad.reshape(-1).nonzero()[0].item())
    lines.append(
        f"{n_bad}/{numel} elements ({100.0 * n_bad / numel:.3g}%) of {name} out of tolerance; "
        f"first (in row-major order) at index {_idx(first, shape)}"
    )
    n_nan = int((torch.isnan(c) & t_fin).sum().item())
    n_inf = int((torch.isinf(c) & t_fin).sum().item())
    if n_nan or n_inf:
        flat_nf = nonfinite.reshape(-1).nonzero().flatten()
        f0, f1 = int(flat_nf[0].item()), int(flat_nf[-1].item())
        block = " (one contiguous block in memory order)" if f1 - f0 + 1 == flat_nf.numel() else ""
        line = (
            f"{n_nan} NaN and {n_inf} Inf where the reference is finite, from index {_idx(f0, shape)} "
            f"to {_idx(f1, shape)}{block}"
        )
        if nan_filled and n_nan:
            line += (
                "; memory was filled with NaN before the candidate ran, so these elements were most likely "
                "never written (an output from torch.empty that the kernel does not fully cover)"
            )
        lines.append(line)
    profile = _axis_profile(bad)
    lines += profile if profile else ["errors spread over every position of every axis"]
    zeros = int(((c == 0) & bad & (t != 0)).sum().item())
    if zeros >= 0.9 * n_bad and zeros > 0:
        lines.append(f"{zeros} of the wrong elements are exactly 0: likely never written (a zero-initialised output)")
    if numel <= MAX_STRUCTURAL_NUMEL and not (n_nan or n_inf):
        direct = _rel(c, t)
        lines += _structural(c, t, direct)
    return lines
