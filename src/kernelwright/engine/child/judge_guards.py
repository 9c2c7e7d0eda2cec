"""The guards' report read by the judge: the facts the runner gathered around two guarded calls
(patched functions, the problem's code run, aliases, threads, kernels) turned into flags, and the
guarded calls' outputs judged (a further input, inputs changed in place, a stale output on
refill, an output changed by a later call). Facts, never a pass.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelwright.core.record import Stage, Status
from kernelwright.engine.child import guards
from kernelwright.engine.child.compare import flatten
from kernelwright.engine.child.correctness import errors
from kernelwright.engine.child.judge_outputs import JudgeOutputs
from kernelwright.engine.child.judge_state import dict_field, first_line, plain_data, text
from kernelwright.engine.child.problem_io import guard_seeds
from kernelwright.engine.child.trees import clone
from kernelwright.engine.child.wire import WireError


class JudgeGuards(JudgeOutputs):
    def r_patched(self, msg: dict[str, Any]) -> None:
        names = [text(n, 120) for n in (msg.get("names") or [])[:50]]
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            self.flag(
                "patched_functions",
                f"the candidate replaced {shown} ({text(msg.get('when'), 80)}); the originals were put back",
            )

    def guards_report(self, msg: dict[str, Any]) -> None:
        self.checked += [
            "patched_functions",
            "calls_reference",
            "mutates_inputs",
            "output_aliases_input",
            "output_changed_later",
            "background_threads",
            "autotuned",
        ]
        facts = dict_field(msg, "facts")
        files = dict_field(msg, "files")
        self.facts["call"] = plain_data({k: v for k, v in facts.items() if k != "aliases"})
        seeds = guard_seeds(self.secret)
        if facts.get("problem_code"):
            self.flag(
                "calls_reference",
                "code of the problem file ran inside ModelNew: "
                + ", ".join(text(x, 100) for x in facts["problem_code"][:5]),
            )
        if self.cfg.guards.profile_kernels:
            self.checked.append("no_custom_kernel")
            if not facts.get("custom_kernel") and not facts.get("profiler_error"):
                self.flag(
                    "no_custom_kernel",
                    "ModelNew launched only PyTorch's built-in operations and kernels "
                    "(no extension function, Triton kernel or custom op of its own ran)",
                )
        ref_alias = self.reference_aliases(seeds["call"])
        for pair in (facts.get("aliases") or [])[:5]:
            if isinstance(pair, list) and len(pair) == 2 and pair[0] not in ref_alias:
                self.flag(
                    "output_aliases_input",
                    f"output {text(pair[0], 80)} shares memory with input "
                    f"{text(pair[1], 80).replace('out', 'inputs', 1)}",
                )
        if facts.get("threads"):  # (the candidate's process's word: any shape, read as text)
            names = ", ".join(text(x, 60) for x in _listed(facts["threads"])[:3])
            self.flag(
                "background_threads",
                f"ModelNew left Python thread(s) running ({names}): work that may escape the timer",
            )
        if facts.get("autotunes"):
            names = ", ".join(text(x, 60) for x in _listed(facts["autotunes"])[:3])
            self.flag(
                "autotuned",
                f"ModelNew's process turned on {names} (its process says): each new process picks its "
                "algorithms by timing them, so the speed-up is a draw of that choice, and a rerun or a "
                "timer in its own process may draw another",
            )
        try:
            ref_out, oracle_out, inputs = self.reference(seeds["call"])
            out_a = self.read(files.get("out_a"))
            j = self.compare(out_a, ref_out, oracle_out, localize=False)
            ok, message = j.passed, j.message
            if not ok and self.first_failure is None:
                self.set_verdict(
                    Status.INCORRECT,
                    f"ModelNew's output on a further input (seed {seeds['call']}) is wrong: " + message,
                    Stage.CORRECTNESS,
                )
            # inputs changed in place, beyond what the reference does to its own copy
            after = self.read(files.get("inputs_after"))
            ref_after = self.reference_inputs_after(seeds["call"])
            for (name, x), (_, rx) in zip(flatten(after), flatten(ref_after), strict=False):
                if isinstance(x, torch.Tensor) and isinstance(rx, torch.Tensor) and not guards.same_values(x, rx):
                    self.flag("mutates_inputs", f"ModelNew changed input {name.replace('out', 'inputs', 1)} in place")
                    break
            if "out_refill" in files:
                self.checked.append("stale_output_on_refill")
                ref_b, oracle_b, _ = self.reference(seeds["refill"])
                out_b = self.read(files["out_refill"])
                j = self.compare(out_b, ref_b, oracle_b, localize=False)
                ok, message = j.passed, j.message
                if not ok and _nearer_the_first(out_b, ref_out, ref_b):
                    self.flag(
                        "stale_output_on_refill",
                        "inputs refilled in place with new values (same tensors, "
                        "same addresses) after correctness gave a wrong output: " + first_line(message),
                    )
                elif not ok and self.first_failure is None:
                    # wrong, but not the first fill's answer kept: a further input's error (an
                    # honest candidate whose errors sit at the tolerance's edge draws one now and then)
                    self.set_verdict(
                        Status.INCORRECT,
                        f"ModelNew's output on a further input (seed {seeds['refill']}, written into the "
                        "tensors of the one before) is wrong: " + message,
                        Stage.CORRECTNESS,
                    )
                again = self.read(files.get("out_a_again"))
                for (name, o), (_, o0) in zip(flatten(again), flatten(out_a), strict=False):
                    if (
                        isinstance(o, torch.Tensor)
                        and isinstance(o0, torch.Tensor)
                        and not guards.same_values(o, o0)
                        and "output_aliases_input" not in self.flags
                    ):
                        self.flag(
                            "output_changed_later",
                            f"output {name} of one call changed when ModelNew ran "
                            "again (it is a persistent buffer that later calls overwrite)",
                        )
                        break
        except WireError as exc:
            self.flag("guard_outputs_unreadable", f"the guarded calls' outputs could not be read: {exc}")

    def reference_inputs_after(self, seed: int) -> Any:
        """The inputs after the reference ran on them (a reference may legitimately change them)."""
        inputs = self.io.inputs(seed)
        with torch.no_grad():
            self.ref_model(*inputs)
        return inputs

    def reference_aliases(self, seed: int) -> set[str]:
        """Names of the reference's outputs that share memory with its inputs (allowed to the candidate too)."""
        inputs = clone(self.reference(seed)[2])
        with torch.no_grad():
            out = self.ref_model(*inputs)
        keys = {guards.storage_key(x) for _, x in guards.tensors(inputs)}
        return {n for n, o in guards.tensors(out) if guards.storage_key(o) in keys}


def _listed(value: Any) -> list[Any]:
    """A list from the runner's report as it is, anything else as one item."""
    return value if isinstance(value, list) else [value]


def _nearer_the_first(out: Any, first_ref: Any, own_ref: Any) -> bool:
    """Whether a refilled call's output lies nearer the reference's output for the inputs the
    tensors held before (a kept answer: a cache by pointer or by object) than its own inputs'."""
    to_first, to_own = errors(out, first_ref), errors(out, own_ref)
    if to_first is None or to_own is None:
        return to_own is None and to_first is not None
    return to_first[0] < to_own[0]
