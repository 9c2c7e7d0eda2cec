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

WHY = ("any kernel that returns this constant is 'correct', so its speed-up measures nothing; "
       "suite speed-up aggregates leave this problem out")


@dataclass
class DegenerateFinding:
    degenerate: bool
    reason: str = ""  # one line: what is constant and why the speed-up means nothing


def _tensors(obj: Any) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in flatten(obj) if isinstance(t, torch.Tensor)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach(), b.detach().to(a.device)
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and torch.equal(a.isnan(), b.isnan()))
    return bool(torch.equal(a, b))


def _constant_value(t: torch.Tensor) -> Any:
    """The single value every element holds, or None."""
    if t.numel() == 0:
        return None
    flat = t.detach().reshape(-1)
    first = flat[0]
    if bool((flat == first).all()):
        return first.item()
    return None


class DegenerateDetector:
    """Fed one trial at a time (inputs, the reference's outputs); `finding()` after two or more."""

    def __init__(self) -> None:
        self.first_inputs: list[tuple[str, torch.Tensor]] | None = None
        self.first_outputs: list[tuple[str, torch.Tensor]] | None = None
        self.trials = 0
        self.inputs_differ = False
        self.outputs_identical = True

    def add(self, inputs: Any, outputs: Any) -> None:
        ins, outs = _tensors(inputs), _tensors(outputs)
        self.trials += 1
        if self.first_outputs is None:
            self.first_inputs = [(n, t.detach().clone()) for n, t in ins]
            self.first_outputs = [(n, t.detach().clone()) for n, t in outs]
            return
        if len(ins) != len(self.first_inputs) or any(not _same(a, b) for (_, a), (_, b) in zip(ins, self.first_inputs)):
            self.inputs_differ = True
        if len(outs) != len(self.first_outputs) or any(not _same(a, b) for (_, a), (_, b) in zip(outs, self.first_outputs)):
            self.outputs_identical = False

    def finding(self) -> DegenerateFinding:
        return judge_degenerate(self.trials, self.inputs_differ, self.outputs_identical, self.first_outputs or [])


def judge_degenerate(trials: int, inputs_differ: bool, outputs_identical: bool,
                     outputs: list[tuple[str, torch.Tensor]]) -> DegenerateFinding:
    """Degenerate when the outputs of `trials` (>= 2) trials with different inputs are identical."""
    if trials < 2 or not inputs_differ or not outputs_identical or not outputs:
        return DegenerateFinding(False)
    what = []
    for name, t in outputs[:3]:
        shape = tuple(t.shape)
        value = _constant_value(t)
        if value is not None:
            what.append(f"{name} is the constant {value:.6g} in every element (shape {shape})"
                        if isinstance(value, (int, float)) else f"{name} is the constant {value} (shape {shape})")
        else:
            what.append(f"{name} (shape {shape}) is the same tensor")
    reason = (f"the reference's output does not depend on its input: in {trials} trials with different inputs "
              f"{'; '.join(what)}; {WHY}")
    return DegenerateFinding(True, reason)


def detect(trials: list[tuple[Any, Any]]) -> DegenerateFinding:
    """`trials`: (inputs, reference outputs) per trial."""
    d = DegenerateDetector()
    for inputs, outputs in trials:
        d.add(inputs, outputs)
    return d.finding()
