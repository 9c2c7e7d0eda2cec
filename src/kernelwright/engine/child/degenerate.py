"""Degenerate references: outputs that do not depend on the inputs (a speed-up over them means nothing).

`degenerate_reason(outputs)` looks at the reference's (or the float64 oracle's) outputs on trials
with different inputs: when they are identical on every trial (a constant, or anything else the
inputs do not reach), it says why in a line; None when the output varies with the input.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelwright.engine.child.compare import flatten


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten(out) if isinstance(t, torch.Tensor) and t.numel() > 0]


def degenerate_reason(outputs: list[Any]) -> str | None:
    if len(outputs) < 2:
        return None
    per_trial = [_leaves(o) for o in outputs]
    if not per_trial[0] or any(len(p) != len(per_trial[0]) for p in per_trial):
        return None
    identical = all(
        a.shape == b.shape and torch.equal(a, b) for p in per_trial[1:] for a, b in zip(per_trial[0], p))
    if identical:
        return (f"the reference's output is identical on {len(outputs)} trials with different inputs: it does not "
                "depend on its inputs, so a kernel that returns a constant is 'correct' and its speed-up means nothing")
    return None
