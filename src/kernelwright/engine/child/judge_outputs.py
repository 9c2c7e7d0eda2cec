"""The judge's own reference, and the candidate's outputs read and judged against it.

`reference(seed)` runs the reference (and its float64 oracle) on the judge's inputs for a seed,
cached within the device's memory; `read` takes one output file of the runner's as plain data
(or its device copy, `device_handoff`), bounded in size; `compare` judges it by the one rule
(`correctness.judge_output`) and, where it is wrong, says where (`localize`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kernelwright.engine.child import device_handoff, localize, numerics
from kernelwright.engine.child.compare import flatten, tensor_bytes
from kernelwright.engine.child.correctness import Judgement, judge_output
from kernelwright.engine.child.judge_state import (
    HandoffUnavailable,
    JudgeState,
    ReferenceFailure,
    bounded_cache,
    memory_bytes,
    short_tb,
)
from kernelwright.engine.child.numerics import NumericsReport
from kernelwright.engine.child.problem_io import sync
from kernelwright.engine.child.trees import clone
from kernelwright.engine.child.wire import WireError, read_tree, write_tree


class JudgeOutputs(JudgeState):
    def reference(self, seed: int) -> tuple[Any, Any, Any]:
        """(reference output, oracle output or None, the inputs): the judge's own, for `seed`."""
        if seed in self.ref_cache:
            return self.ref_cache[seed]
        for attempt in (0, 1):
            try:
                inputs = self.io.inputs(seed)
                args = clone(inputs)
                sync(self.device)
                t0 = time.perf_counter()
                with torch.no_grad():
                    ref_out = self.ref_model(*args)
                sync(self.device)
                self.ref_call_s.append(time.perf_counter() - t0)
                break
            except torch.OutOfMemoryError as exc:
                # what the judge keeps of earlier seeds is the first to go (a problem whose outputs
                # take gigabytes: the device ran out with the cache full)
                if attempt or not self.ref_cache:
                    raise ReferenceFailure(short_tb(exc)) from exc
                inputs = args = None
                self.ref_cache = {}
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            except Exception as exc:
                raise ReferenceFailure(short_tb(exc)) from exc
        oracle_out = None
        if self.cfg.numerics.oracle and not self.oracle_error:
            try:
                dtype = numerics.oracle_dtype(self.cfg.numerics.oracle_dtype)
                if self.oracle is None:
                    self.oracle = numerics.build_oracle(self.ref_model, dtype)
                oracle_out = numerics.run_oracle(self.oracle, inputs, dtype)
                sync(self.device)
            except Exception as exc:
                self.oracle_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        # at most 9 seeds, and at most a sixth of the device's memory (one seed's outputs and their
        # float64 oracle can take gigabytes)
        self.ref_cache = bounded_cache(
            {**self.ref_cache, seed: (ref_out, oracle_out, inputs)}, memory_bytes(self.device) // 6
        )
        self.largest_bytes = max(self.largest_bytes, tensor_bytes((ref_out, inputs)))
        return ref_out, oracle_out, inputs

    def read(self, name: Any) -> Any:
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise WireError("the runner named an output file outside its directory")
        # an output file is never much larger than what the reference returns and takes: a bound
        # keeps a candidate from making the judge read gigabytes it wrote on purpose
        limit = 4 * self.largest_bytes + (64 << 20)
        path = os.path.join(self.out_dir, name)
        spill = self.job.spill_dir
        if spill and not os.path.lexists(path):  # the runner spilled it to the disk (memory full)
            path = os.path.join(spill, name)
        try:
            return read_tree(path, self.device, max_bytes=limit, fetch=self.fetcher(name))
        finally:
            try:  # read once: its memory (the output directory may be a tmpfs) is freed now
                os.unlink(path)
            except OSError:
                pass

    def fetcher(self, name: str) -> Callable[[int, int], torch.Tensor] | None:
        """Leaf i's bytes of output `name`, sent by the runner on the device (`device_handoff`)."""
        handoff = self.handoff
        if handoff is None or self.device.type != "cuda" or not self.cfg.device_handoff:
            return None

        def fetch(i: int, nbytes: int) -> torch.Tensor:
            t0 = time.monotonic()
            try:
                return device_handoff.receive(handoff, f"{name}#{i}#{nbytes}", nbytes, self.device)
            except (device_handoff.HandoffError, device_handoff.Unavailable) as exc:
                if self.handoff_self_test:  # the judge's own side is broken: not the candidate's fault
                    raise HandoffUnavailable(
                        f"the judge cannot import device outputs on this machine ({self.handoff_self_test}); "
                        f"this output failed with: {exc}; "
                        "set `device_handoff = false` under [eval] in kernelwright.toml"
                    ) from None
                raise WireError(str(exc)) from None
            finally:
                self.handoff_s += time.monotonic() - t0

        return fetch

    def compare(self, cand: Any, ref_out: Any, oracle_out: Any, localize: bool) -> Judgement:
        """The output judged by the one rule (`correctness.judge_output`); where it is wrong (and
        its structure is the reference's) and `localize`, its message says where."""
        j = judge_output(cand, ref_out, oracle_out, self.cfg)
        if not j.passed and j.strict is not None and self.cfg.numerics.localize and localize:
            target = oracle_out if j.calibrated is not None else ref_out
            j.message = self.localize(j.message, cand, target, j.calibrated)
        return j

    def localize(self, message: str, cand: Any, target: Any, rep: NumericsReport | None) -> str:
        extra = []
        nan_fill = self.cfg.guards.enabled and self.cfg.guards.nan_fill
        for (name, c), (_, t) in zip(flatten(cand), flatten(target), strict=False):
            if not (isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor)) or c.shape != t.shape:
                continue
            if not (t.is_floating_point() or t.is_complex()):
                continue
            try:
                # calibrated: the tolerance its verdict applied (rtol raised to the output dtype's ulp)
                rtol = self.cfg.rtol if rep is None else numerics.resolution_rtol(c.dtype, self.cfg.rtol)
                lines = localize.localize(c, t, self.cfg.atol, rtol, name, nan_filled=nan_fill)
            except Exception as exc:
                lines = [f"(localisation failed: {type(exc).__name__}: {str(exc)[:200]})"]
            if lines and nan_fill and any("never written" in ln for ln in lines):
                self.flag("unwritten_output", f"{name} holds NaN where memory was filled with NaN before ModelNew ran")
            if rep is not None:
                for leaf in rep.failing():
                    if leaf.name == name and numerics.lower_precision_suspected(t, leaf.candidate, c.dtype):
                        self.flag(
                            "lower_precision_suspected",
                            f"{name}'s normwise error {leaf.candidate.norm_rel:.2e} "
                            "is at the level of bf16/fp16 rounding",
                        )
                        lines.append(
                            "the error is at the level of bf16/fp16 rounding: lower precision than the problem's dtype?"
                        )
            extra += [f"  where: {ln}" for ln in lines]
        return message + ("\n" + "\n".join(extra) if extra else "")

    def write_inputs(self, name: str, obj: Any) -> str:
        path = os.path.join(self.out_dir, name)
        try:
            os.unlink(path)  # whatever stands there was not written by this judge
        except FileNotFoundError:
            pass
        write_tree(path, obj)
        return name

    def inputs_file(self, seed: int) -> str:
        """The wire file holding the judge's inputs for `seed` (written once)."""
        if seed not in self.input_files:
            _, _, inputs = self.reference(seed)
            self.input_files[seed] = self.write_inputs(f"in_{len(self.input_files):03d}.kwt", inputs)
        return self.input_files[seed]
