"""Other sizes of a problem: the judge checks a passed candidate where the problem's constants differ.

A KernelBench problem fixes its sizes in module-level integers (`batch_size = 16`, `dim = 1024`)
that `get_inputs()` and `get_init_inputs()` read; a kernel that hard-codes them passes every check
made at those sizes. `size_constants` finds the integers those two functions read (their code,
nested code and the module's own helper functions they call), `candidates` derives other values,
one constant changed at a time so that a failure names the size that broke:

- the batch (the constant named like `batch`, else the one equal to the first input's leading
  dimension): half, double, and 1;
- every other constant of at least 4: an odd size, n - 1 for an even n, n + 2 for an odd one
  (1023 for 1024: no multiple of 2, 8 or a tile size).

`derive` re-runs the problem's functions with the module's globals replaced for each candidate and
keeps a variant only when it changes the shape of some input tensor (a constant that changes none,
such as a reduction axis or a class count, is a parameter, not a size), the reference constructs
and runs on it, and it stays within a budget: inputs and output at most `BYTES_FACTOR` times the
problem's own (or `MIN_BUDGET_BYTES`), a reference forward at most `TIME_FACTOR` times its own (or
`MIN_BUDGET_S`), and all kept variants together at most `TOTAL_FACTOR` times the problem's own
(the judge holds their outputs until the candidate's come). At most `MAX_VARIANTS` are kept.
Torch and the standard library only; the judge passes in how to draw, construct and run (`judge.py`, "other sizes").
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_VARIANTS = 6
BYTES_FACTOR = 2.5
MIN_BUDGET_BYTES = 64 << 20
TOTAL_FACTOR = 6.0  # what the kept variants hold together (inputs, outputs, oracle outputs)
TIME_FACTOR = 4.0
MIN_BUDGET_S = 0.05
MIN_DIM = 4  # a constant under this is left alone (a channel count of 3, a head count of 2)
_FOLLOW_DEPTH = 3  # helper functions of the problem followed from get_inputs / get_init_inputs


@dataclass
class Variant:
    """One other size the reference accepted, with what the judge needs to judge a candidate there."""

    label: str  # the runner's output label ("shape0")
    sizes: dict[str, int]  # the constants changed, to their new values
    why: str  # "half the batch", "odd size", ...
    init_inputs: Any
    init_changed: bool  # a new ModelNew is constructed for it
    ref_model: Any
    inputs: Any
    ref_out: Any
    oracle_out: Any = None

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes.items())


@dataclass
class Plan:
    constants: dict[str, int] = field(default_factory=dict)  # the size constants found, at the problem's values
    batch: str | None = None
    variants: list[Variant] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)  # {"sizes": ..., "why": ...}
    note: str = ""  # why nothing can be varied ('' when something was tried)


def _code_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):  # comprehensions, lambdas, nested functions
            names += _code_names(c)
    return names


def read_names(fn: Any, module: types.ModuleType, depth: int = _FOLLOW_DEPTH) -> list[str]:
    """The global names `fn` reads, in order of first use, through the module's own functions it calls."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    out: list[str] = []
    for name in _code_names(code):
        if name in out:
            continue
        out.append(name)
        obj = module.__dict__.get(name)
        if depth > 0 and isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            out += [n for n in read_names(obj, module, depth - 1) if n not in out]
    return out


def _int_constants(names: list[str], module: types.ModuleType) -> list[str]:
    return [n for n in names if type(module.__dict__.get(n)) is int and module.__dict__[n] >= 1]


def size_constants(module: types.ModuleType) -> tuple[dict[str, int], set[str]]:
    """({name: value} of the integers get_inputs and get_init_inputs read, names read by get_inputs)."""
    in_inputs = _int_constants(read_names(getattr(module, "get_inputs", None), module), module)
    in_init = _int_constants(read_names(getattr(module, "get_init_inputs", None), module), module)
    names = in_inputs + [n for n in in_init if n not in in_inputs]
    return {n: module.__dict__[n] for n in names}, set(in_inputs)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def batch_constant(constants: dict[str, int], in_inputs: set[str], base_inputs: Any) -> str | None:
    """The batch-like constant: one named like a batch, else the one equal to the first input's leading size."""
    named = [n for n in constants if n in in_inputs and "batch" in n.lower()]
    if named:
        return named[0]
    first = _tensors(base_inputs)[:1]
    if first and first[0].dim() >= 2:
        lead = first[0].shape[0]
        for n, v in constants.items():
            if n in in_inputs and v == lead:
                return n
    return None


def odd_size(n: int) -> int:
    return n - 1 if n % 2 == 0 else n + 2


def candidates(constants: dict[str, int], batch: str | None) -> list[tuple[dict[str, int], str]]:
    """Other values, one constant at a time, in the order they are tried."""
    out: list[tuple[dict[str, int], str]] = []
    if batch is not None:
        b = constants[batch]
        if b >= 2:
            out.append(({batch: b // 2}, "half the batch"))
        out.append(({batch: 2 * b}, "double the batch"))
    for n, v in constants.items():
        if n != batch and v >= MIN_DIM:
            out.append(({n: odd_size(v)}, "odd size"))
    if batch is not None and constants[batch] > 2:
        out.append(({batch: 1}, "batch 1"))
    return out


@contextlib.contextmanager
def sizes_set(module: types.ModuleType, sizes: dict[str, int]) -> Iterator[None]:
    """The module's constants replaced for the duration (the problem's functions read them as globals)."""
    saved = {n: module.__dict__[n] for n in sizes}
    try:
        module.__dict__.update(sizes)
        yield
    finally:
        module.__dict__.update(saved)


def same(a: Any, b: Any) -> bool:
    """Equal init inputs: same structure, equal plain values, tensors of equal shape, dtype and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    try:
        return bool(a == b)
    except Exception:
        return False


def shapes_change(base: Any, other: Any) -> bool:
    """Same tensors (count, dtype, rank) of which at least one has another shape."""
    ta, tb = _tensors(base), _tensors(other)
    if len(ta) != len(tb) or any(x.dtype != y.dtype or x.dim() != y.dim() for x, y in zip(ta, tb, strict=False)):
        return False
    return any(x.shape != y.shape for x, y in zip(ta, tb, strict=False))


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def derive(
    problem: types.ModuleType,
    *,
    base_model: Any,
    base_init: Any,
    base_inputs: Any,
    seeds: list[int],
    draw: Callable[[int], Any],
    init: Callable[[], Any],
    construct: Callable[[Any], Any],
    forward: Callable[[Any, Any], Any],
    oracle: Callable[[Any, Any], Any],
    max_variants: int = MAX_VARIANTS,
) -> Plan:
    """The variants the reference accepts. `draw(seed)` the problem's inputs, `init()` its init
    inputs, `construct(init)` a reference model, `forward(model, inputs)` its output (synchronised),
    `oracle(model, inputs)` the oracle's output or None; all run with the module's sizes replaced."""
    constants, in_inputs = size_constants(problem)
    plan = Plan(constants=constants)
    if not constants:
        plan.note = (
            "the problem's sizes cannot be varied: get_inputs() and get_init_inputs() read no module-level integer"
        )
        return plan
    plan.batch = batch_constant(constants, in_inputs, base_inputs)
    t0 = time.perf_counter()
    base_out = forward(base_model, base_inputs)
    base_s = time.perf_counter() - t0
    budget_bytes = max(BYTES_FACTOR * (nbytes(base_inputs) + nbytes(base_out)), MIN_BUDGET_BYTES)
    budget_s = max(TIME_FACTOR * base_s, MIN_BUDGET_S)
    total_bytes = budget_bytes / BYTES_FACTOR * TOTAL_FACTOR
    held = 0
    del base_out
    for sizes, why in candidates(constants, plan.batch):
        if len(plan.variants) >= max_variants:
            break
        name = ", ".join(f"{k}={v}" for k, v in sizes.items())
        try:
            with sizes_set(problem, sizes):
                init_inputs = init()
                inputs = draw(seeds[len(plan.variants) % len(seeds)])
                if not shapes_change(base_inputs, inputs):
                    plan.dropped.append(
                        {"sizes": name, "why": "no input tensor changes shape with it (a parameter, not a size)"}
                    )
                    continue
                if nbytes(inputs) > budget_bytes:
                    plan.dropped.append(
                        {
                            "sizes": name,
                            "why": f"its inputs need {nbytes(inputs) >> 20} MiB, over "
                            f"the budget of {int(budget_bytes) >> 20} MiB",
                        }
                    )
                    continue
                init_changed = not same(init_inputs, base_init)
                model = construct(init_inputs) if init_changed else base_model
                t0 = time.perf_counter()
                out = forward(model, inputs)
                took = time.perf_counter() - t0
                if took > budget_s:
                    plan.dropped.append(
                        {
                            "sizes": name,
                            "why": f"the reference took {took:.3g} s there, over the budget of {budget_s:.3g} s",
                        }
                    )
                    continue
                if nbytes(inputs) + nbytes(out) > budget_bytes:
                    plan.dropped.append(
                        {
                            "sizes": name,
                            "why": f"its inputs and output are over the budget of {int(budget_bytes) >> 20} MiB",
                        }
                    )
                    continue
                expected = oracle(model, inputs)
        except Exception as exc:  # the reference itself does not take this size
            plan.dropped.append({"sizes": name, "why": f"the reference rejects it ({_short(exc)})"})
            continue
        size = nbytes(inputs) + nbytes(out) + nbytes(expected)
        if held + size > total_bytes:
            plan.dropped.append(
                {
                    "sizes": name,
                    "why": f"the sizes kept before it hold {held >> 20} MiB of the "
                    f"budget of {int(total_bytes) >> 20} MiB",
                }
            )
            continue
        held += size
        plan.variants.append(
            Variant(
                label=f"shape{len(plan.variants)}",
                sizes=sizes,
                why=why,
                init_inputs=init_inputs,
                init_changed=init_changed,
                ref_model=model,
                inputs=inputs,
                ref_out=out,
                oracle_out=expected,
            )
        )
    if not plan.variants:
        plan.note = "no other size was kept: " + "; ".join(f"{d['sizes']}: {d['why']}" for d in plan.dropped[:6])
    return plan
