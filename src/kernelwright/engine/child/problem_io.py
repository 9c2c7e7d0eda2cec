"""The problem side that the runner and the judge share: loading a module from a file, drawing a
trial's inputs for a seed, constructing a model for a seed. Both processes draw the same inputs
for the same seed; the judge's draw is the truth (the runner's is only what the candidate saw)."""

from __future__ import annotations

import importlib.util
import platform
import sys
import types
from typing import Any

import torch

from kernelwright.engine.child.compare import flatten
from kernelwright.engine.child.trees import clone, to_device

GUARD_SEED_OFFSET = 777_777  # guard inputs are not the trials' inputs


def trial_seed(base: int, trial: int) -> int:
    return base + 1000 * (trial + 1)


# The seeds of the guarded calls (all drawn by both sides).
def guard_seeds(base: int) -> dict[str, int]:
    g = base + GUARD_SEED_OFFSET
    return {"call": g, "refill": g + 1, "after_timing": g + 2, "timing_b": g + 3}


def load_module(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a module (not a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_source(source: str, filename: str, name: str) -> types.ModuleType:
    """A module from source text (the judge's copy of the problem: no file the runner could change)."""
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def torch_device(want: str) -> torch.device:
    """The torch device of the evaluation's device, resolved by the parent ("auto" never reaches a child)."""
    if want not in ("cuda", "cpu"):
        raise RuntimeError(f"device {want!r} reached the evaluation child unresolved; the parent resolves it")
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA requested but not available in the evaluation child")
    return torch.device(want)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ProblemIO:
    """Inputs and models of one problem on one device, seeded."""

    def __init__(
        self,
        problem: Any,
        device: torch.device,
        on_device: bool,
        meta: dict[str, Any],
        model_mode: str = "as_constructed",
    ):
        self.problem = problem
        self.device = device
        self.model_mode = model_mode
        self.draws_in_eval = False  # settle_mode: the reference draws at random whatever its mode
        self._probed: tuple[int, Any] | None = None  # settle_mode's input set, for the first check to reuse
        self.on_device = on_device and device.type != "cpu"
        self.meta = meta  # where the inputs were drawn is recorded here

    def inputs(self, seed: int) -> Any:
        """The problem's inputs for one seed, on the device: drawn there, or on the CPU and copied
        where get_inputs cannot run with the device as torch's default."""
        if self._probed is not None and self._probed[0] == seed:  # settle_mode drew them (never written to)
            drawn, self._probed = self._probed[1], None
            return drawn
        if self.on_device:
            seed_all(seed)
            try:
                with torch.device(self.device):
                    inputs = self.problem.get_inputs()
                self.meta["inputs_drawn_on"] = self.device.type
                return to_device(inputs, self.device)
            except Exception as exc:
                self.on_device = False
                self.meta["inputs_drawn_on"] = "cpu"
                self.meta["inputs_on_device_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        seed_all(seed)
        return to_device(self.problem.get_inputs(), self.device)

    def construct(self, cls: type, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        init_inputs = self.problem.get_init_inputs()
        torch.manual_seed(seed)
        return in_mode(cls(*init_inputs).to(self.device), self.model_mode)

    def settle_mode(self, model: torch.nn.Module, seed: int) -> str:
        """The mode both models run in, decided once before the reference's first checked call. As
        constructed (the default), a model whose output is a random draw there (a Dropout, a drop
        path: two calls on one input set differ) cannot be checked value by value, so both run in
        eval mode instead, and the record says why (`metadata["model_mode"]`). One that draws in eval
        mode too (`torch.rand` in its forward) keeps the mode asked for and sets `draws_in_eval`: the
        judge then checks strictly, never within the reference's own noise. Its state (a BatchNorm's
        running statistics) is put back as it was before each pair of probing calls."""
        inputs: list[Any] = []

        def draws() -> bool:
            if not inputs:
                inputs.append(self.inputs(seed))
                self._probed = (seed, inputs[0])
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            with torch.no_grad():
                first = model(*clone(inputs[0]))
                second = model(*clone(inputs[0]))
            model.load_state_dict(state)
            return not _same(first, second)

        asked = self.model_mode
        constructed = [(m, m.training) for m in model.modules()]  # each module's mode as constructed
        if asked != "eval" and draws():
            model.eval()
            self.model_mode = "eval"
            self.meta["model_mode"] = {
                "asked": asked,
                "used": "eval",
                "why": "the reference's output is a random draw as constructed (two calls on one input set "
                "differ: a Dropout or a drop path in training mode), so both models run in eval mode",
            }
        if self.model_mode == "eval" and draws():
            self.draws_in_eval = True
            for m, training in constructed:  # eval mode removed no draw: the mode asked for stands
                m.training = training
            self.model_mode = asked
            self.meta["model_mode"] = {
                "asked": asked,
                "used": asked,
                "why": "the reference's output is a random draw in eval mode too (two calls on one input set "
                "differ: random numbers in its forward), so it is checked strictly against one draw, never "
                "within its own noise: only a candidate that draws alike passes",
            }
        return self.model_mode


def _same(a: Any, b: Any) -> bool:
    """Two outputs of one input set alike, up to a kernel's order of summation (atomics, in bf16 too):
    a dropout's or a drop path's draws differ by the size of the elements themselves."""
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for (_, x), (_, y) in zip(la, lb, strict=True):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not (
            torch.allclose(x, y, rtol=1e-2, atol=1e-3, equal_nan=True) if x.is_floating_point() else torch.equal(x, y)
        ):
            return False
    return True


def in_mode(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """The model in the evaluation's mode (EvalConfig.model_mode): as its constructor left it
    (KernelBench's), or in eval mode. The reference and the candidate are put in the same mode."""
    return model.eval() if mode == "eval" else model


def seed_all(seed: int) -> None:
    """What `torch.manual_seed(seed)` does to every generator a problem can draw from, without its
    cost where CUDA is not initialised: there torch queues a lazy CUDA seeding and records a stack
    trace for it on every call (~0.2 ms; the timing windows draw thousands of input sets)."""
    if torch.cuda.is_available() and not torch.cuda.is_initialized():
        torch.manual_seed(seed)  # a GPU that may yet be used: let torch queue its seeding
        return
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def fingerprint(inputs: Any) -> list[Any]:
    """A cheap summary of the inputs (shape, dtype, float64 sum and sum of squares per tensor):
    the judge compares the runner's with its own to catch inputs that differ."""
    from kernelwright.engine.child.compare import flatten

    out: list[Any] = []
    for _, x in flatten(inputs):
        if isinstance(x, torch.Tensor) and x.is_floating_point():  # float64 sums, no float64 copy
            x = x.detach()
            out.append(
                [
                    list(x.shape),
                    str(x.dtype),
                    float(x.sum(dtype=torch.float64)),
                    float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2,
                ]
            )
        elif isinstance(x, torch.Tensor):
            d = x.detach().to(torch.float64) if not x.is_complex() else x.detach().abs().to(torch.float64)
            out.append([list(x.shape), str(x.dtype), float(d.sum()), float((d * d).sum())])
        elif isinstance(x, (int, float, bool, str)) or x is None:
            out.append(x)
        else:
            out.append(type(x).__name__)
    return out


def same_fingerprint(a: Any, b: Any, rel: float = 1e-9) -> bool:
    if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=False):
        if isinstance(x, list) and isinstance(y, list) and len(x) == 4 and len(y) == 4:
            if x[0] != y[0] or x[1] != y[1]:
                return False
            for u, v in zip(x[2:], y[2:], strict=False):
                if not isinstance(v, (int, float)):
                    return False
                if u != v and not abs(u - v) <= rel * max(abs(u), abs(v)):
                    if not (u != u and v != v):  # both NaN
                        return False
        elif x != y:
            return False
    return True
