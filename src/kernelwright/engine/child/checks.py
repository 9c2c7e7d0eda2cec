"""The numerics verdict and the guards, wired into the child's correctness and timing stages.

`main.Evaluation` calls these at a few marked points; everything they find goes into the
record: per trial `trials[i].extra["numerics"]`, and `metadata["numerics"]`, `metadata["guards"]`
(`flags`: name -> one-line detail; `failed`: the flags that fail the verdict under
`GuardConfig.fail_on`). A failing guard turns the verdict into `incorrect` with a log that names it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelwright.engine.child import degenerate, guards, localize, numerics
from kernelwright.engine.child.trees import clone as _clone
from kernelwright.core.record import Stage, Status

GUARD_SEED_OFFSET = 777_777  # guard inputs are not the trials' inputs


class Checks:
    def __init__(self, ev) -> None:
        self.ev = ev
        self.cfg = ev.cfg
        self.gcfg = ev.cfg.guards
        self.ncfg = ev.cfg.numerics
        self.snapshot: guards.FunctionSnapshot | None = None
        self.oracle = None
        self.oracle_error = ""
        self.flags: dict[str, str] = {}
        self.checked: list[str] = []
        self.facts: dict[str, Any] = {}
        self.expected = None  # the candidate's verified output on trial 0's inputs (for timed runs)
        self.ref_err_scale = 0.0  # the reference's own max-abs error against the oracle, trial 0
        self.degenerate = degenerate.DegenerateDetector()  # [verdicts] reference outputs per trial
        self.numerics_summary: dict[str, Any] = {
            "verdict": self.cfg.verdict, "oracle": self.ncfg.oracle, "oracle_dtype": self.ncfg.oracle_dtype,
            "factor": self.ncfg.factor, "excess_floor": self.ncfg.excess_floor, "ill_conditioned": False, "strict_passed": True, "calibrated_passed": True,
        }

    # ---- bookkeeping ----------------------------------------------------------------------
    @property
    def nan_fill_on(self) -> bool:
        return self.gcfg.enabled and self.gcfg.nan_fill

    def flag(self, name: str, detail: str) -> None:
        self.flags.setdefault(name, detail)

    def failed(self) -> list[str]:
        return [f for f in self.flags if f in self.gcfg.fail_on]

    def publish(self) -> None:
        md = self.ev.rec["metadata"]
        md["guards"] = {
            "enabled": self.gcfg.enabled, "checked": self.checked, "flags": dict(self.flags),
            "failed": self.failed(), "fail_on": list(self.gcfg.fail_on), "nan_fill": self.nan_fill_on,
            "facts": self.facts,
        }
        md["numerics"] = dict(self.numerics_summary, oracle_error=self.oracle_error or None)

    def _guard_verdict(self, stage: Stage) -> bool:
        """Fail the verdict when a flag in fail_on was raised; True when the candidate stands."""
        self.publish()
        bad = self.failed()
        if not bad:
            return True
        lines = [f"Reward-hacking guard failed: {', '.join(bad)}"]
        lines += [f"  {name}: {self.flags[name]}" for name in bad]
        self.ev.verdict(Status.INCORRECT, "\n".join(lines), stage)
        self.ev.rec["correct"] = False
        return False

    # ---- patched functions ------------------------------------------------------------------
    def take_snapshot(self) -> None:
        if self.gcfg.enabled:
            self.snapshot = guards.FunctionSnapshot()
            self.threads_at_start = guards.python_threads()

    def check_patches(self, when: str) -> bool:
        """Flag and undo any patch of timing, verifier or torch functions; True when one was found."""
        if self.snapshot is None:
            return False
        if "patched_functions" not in self.checked:
            self.checked.append("patched_functions")
        changed = self.snapshot.changed()
        if not changed:
            return False
        self.snapshot.restore()
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        self.flag("patched_functions", f"the candidate replaced {shown} ({when}); the originals were put back")
        return True

    # ---- numerics ------------------------------------------------------------------------------
    def _oracle_out(self, inputs: Any):
        if not self.ncfg.oracle or self.oracle_error:
            return None
        try:
            dtype = numerics.oracle_dtype(self.ncfg.oracle_dtype)
            if self.oracle is None:
                self.oracle = numerics.build_oracle(self.ev.ref_model, dtype)
            out = numerics.run_oracle(self.oracle, inputs, dtype)
            self.ev._sync()
            return out
        except Exception as exc:  # a reference that cannot run upcast: say so, judge strictly
            self.oracle_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            return None

    def judge_outputs(self, inputs: Any, cand_out: Any, ref_out: Any, strict_report,
                      localize_failure: bool = True) -> tuple[bool, str, dict]:
        """(passed, message, numerics evidence) under the configured verdict mode."""
        from kernelwright.engine.child.compare import compare_outputs

        if self.check_patches("while ModelNew ran"):  # the strict report may have used patched functions
            strict_report = compare_outputs(cand_out, ref_out, self.cfg.atol, self.cfg.rtol)
        oracle_out = self._oracle_out(inputs)
        rep = None
        if oracle_out is not None:
            rep = numerics.judge(cand_out, ref_out, oracle_out, self.cfg.atol, self.cfg.rtol, self.ncfg.factor,
                                 excess_floor=self.ncfg.excess_floor)  # [verdicts] element-by-element test
        evidence: dict[str, Any] = {"strict_passed": strict_report.passed}
        if rep is not None and rep.ok:
            evidence.update(rep.to_dict())
            evidence["calibrated_passed"] = rep.passed
        use_calibrated = self.cfg.verdict == "calibrated" and rep is not None and rep.ok and strict_report.max_abs_err is not None
        if use_calibrated:
            passed, message = rep.passed, rep.message
            # non-numeric leaves (ints, strings) still need the strict comparison
            structural = [l for l in strict_report.leaves if not l.passed and l.max_abs_err is None]
            if structural:
                passed, message = False, strict_report.message
        else:
            passed, message = strict_report.passed, strict_report.message
        if not passed and self.ncfg.localize and localize_failure:
            message = self._localize(message, cand_out, oracle_out if use_calibrated else ref_out,
                                     ref_out, rep if use_calibrated else None)
            message += "".join(f"\n  where: {ln}" for ln in self._ablation(inputs))
        return passed, message, evidence

    def _ablation(self, inputs: Any, max_params: int = 8, budget_s: float = 3.0) -> list[str]:
        """Which parameter, zeroed in both models, makes the mismatch go away (a pointer to the bug).

        Only parameters that both models hold under the same name and shape are tried, each
        restored afterwards; a zeroing that leaves the reference's output all zero says nothing
        and is not reported. Example: a segment sum off by one in a decay `exp(segsum(A))` vanishes
        with A = 0, since every decay is then 1.
        """
        import time

        from kernelwright.engine.child.compare import compare_outputs, flatten

        ev = self.ev
        cand_params = dict(ev.cand_model.named_parameters())
        shared = [(n, p, cand_params[n]) for n, p in ev.ref_model.named_parameters()
                  if n in cand_params and cand_params[n].shape == p.shape and p.is_floating_point()]
        lines: list[str] = []
        t0 = time.perf_counter()
        for name, p_ref, p_cand in shared[:max_params]:
            if time.perf_counter() - t0 > budget_s:
                break
            saved_ref, saved_cand = p_ref.detach().clone(), p_cand.detach().clone()
            try:
                with torch.no_grad():
                    p_ref.zero_()
                    p_cand.zero_()
                    ref_out = ev.ref_model(*_clone(inputs))
                    cand_out = ev.cand_model(*_clone(inputs))
                ev._sync()
                rep = compare_outputs(cand_out, ref_out, self.cfg.atol, self.cfg.rtol)
                nonzero = any(isinstance(t, torch.Tensor) and t.numel() and bool(t.ne(0).any())
                              for _, t in flatten(ref_out))
                if rep.passed and nonzero:
                    lines.append(f"the mismatch disappears when parameter '{name}' is set to 0 in both models "
                                 f"(outputs still non-zero): look at how '{name}' is used")
            except Exception:  # evidence only: a candidate that cannot run this way tells us nothing
                pass
            finally:
                with torch.no_grad():
                    p_ref.copy_(saved_ref)
                    p_cand.copy_(saved_cand)
        return lines

    def _localize(self, message: str, cand_out: Any, target: Any, ref_out: Any, rep) -> str:
        from kernelwright.engine.child.compare import flatten

        extra = []
        for (name, c), (_, t) in zip(flatten(cand_out), flatten(target)):
            if not (isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor)) or c.shape != t.shape:
                continue
            if not (t.is_floating_point() or t.is_complex()):
                continue
            try:
                lines = localize.localize(c, t, self.cfg.atol, self.cfg.rtol, name, nan_filled=self.nan_fill_on)
            except Exception as exc:  # localisation is evidence, never a verdict
                lines = [f"(localisation failed: {type(exc).__name__}: {str(exc)[:200]})"]
            if lines and self.nan_fill_on and any("never written" in ln for ln in lines):
                self.flag("unwritten_output", f"{name} holds NaN where memory was filled with NaN before ModelNew ran")
            if rep is not None:
                for leaf in rep.failing():
                    if leaf.name == name and numerics.lower_precision_suspected(c, t, leaf.candidate):
                        self.flag("lower_precision_suspected",
                                  f"{name}'s normwise error {leaf.candidate.norm_rel:.2e} is at the level of bf16/fp16 rounding")
                        lines.append("the error is at the level of bf16/fp16 rounding: lower precision than the problem's dtype?")
            extra += [f"  where: {ln}" for ln in lines]
        return message + ("\n" + "\n".join(extra) if extra else "")

    def judge_trial(self, t: int, inputs: Any, cand_out: Any, ref_out: Any, report, trial: dict) -> None:
        first_failure = all(tr["passed"] for tr in self.ev.rec["trials"])  # only that one is localised
        passed, message, evidence = self.judge_outputs(inputs, cand_out, ref_out, report, first_failure)
        self.degenerate.add(inputs, ref_out)  # [verdicts] does the reference depend on its input?
        trial["passed"], trial["message"] = passed, message
        trial["extra"]["numerics"] = evidence
        s = self.numerics_summary
        s["strict_passed"] = s["strict_passed"] and evidence["strict_passed"]
        if "calibrated_passed" in evidence:
            s["calibrated_passed"] = s["calibrated_passed"] and evidence["calibrated_passed"]
            s["ill_conditioned"] = s["ill_conditioned"] or evidence["ill_conditioned"]
        else:
            s["calibrated_passed"] = None
        if t == 0 and passed:
            self.expected = _clone(cand_out)
            refs = [l["reference"]["max_abs"] for l in evidence.get("leaves", []) if math.isfinite(l["reference"]["max_abs"])]
            self.ref_err_scale = max(refs) if refs else 0.0
        self.publish()

    # ---- guards after correctness -----------------------------------------------------------------
    def after_correctness(self) -> bool:
        """The guarded calls: mutation, aliasing, later change, refill, reference code, own kernel."""
        ev = self.ev
        finding = self.degenerate.finding()  # [verdicts] a fact about the problem, never a failure
        self.checked.append("degenerate_reference")
        if finding.degenerate:
            self.flag("degenerate_reference", finding.reason)
        if not self.gcfg.enabled:
            self.publish()
            return True
        from kernelwright.engine.child import build

        seed = ev.cfg.seed + GUARD_SEED_OFFSET
        inputs = ev._inputs(seed)
        ref_inputs = _clone(inputs)
        with torch.no_grad():
            ref_out = ev.ref_model(*ref_inputs)
        ev._sync()
        threads_before = getattr(self, "threads_at_start", None) or guards.python_threads()
        candidate_text = ""
        try:
            with open(ev.job["candidate_path"]) as f:
                candidate_text = f.read()
        except OSError:
            pass
        ext_names = {b.get("name") for b in build.BUILD_LOG if b.get("name")}
        ext_dirs = [b.get("dir") for b in build.BUILD_LOG if b.get("dir")]
        tracer = guards.CallTracer(ev.job["problem_path"], ev.job["candidate_path"], ext_names, ext_dirs,
                                   candidate_text, self.gcfg.profile_kernels, ev.device)
        with torch.no_grad(), guards.nan_fill(self.nan_fill_on):
            out_a = tracer.run(lambda: ev.cand_model(*inputs))
        ev._sync()
        self.check_patches("while ModelNew ran")
        facts = tracer.facts
        self.facts["call"] = {k: v for k, v in vars(facts).items() if v}
        self.checked += ["calls_reference", "mutates_inputs", "output_aliases_input", "output_changed_later",
                         "background_threads"]

        if facts.problem_code:
            self.flag("calls_reference", "code of the problem file ran inside ModelNew: " + ", ".join(facts.problem_code[:5]))
        if self.gcfg.profile_kernels:
            self.checked.append("no_custom_kernel")
            if not facts.custom_kernel and not facts.profiler_error:
                self.flag("no_custom_kernel", "ModelNew launched only PyTorch's built-in operations and kernels "
                          "(no extension function, Triton kernel or custom op of its own ran)")

        # inputs changed in place, beyond what the reference does to its own copy
        for (name, x), (_, rx) in zip(guards.tensors(inputs), guards.tensors(ref_inputs)):
            if not guards.same_values(x, rx):
                self.flag("mutates_inputs", f"ModelNew changed input {name.replace('out', 'inputs', 1)} in place")
                break

        # outputs sharing memory with inputs (when the reference's do not)
        in_keys = {guards.storage_key(x): n for n, x in guards.tensors(inputs)}
        ref_in_keys = {guards.storage_key(x) for _, x in guards.tensors(ref_inputs)}
        ref_alias = {n for n, o in guards.tensors(ref_out) if guards.storage_key(o) in ref_in_keys}
        for name, o in guards.tensors(out_a):
            k = guards.storage_key(o)
            if k in in_keys and name not in ref_alias:
                self.flag("output_aliases_input", f"output {name} shares memory with input "
                          f"{in_keys[k].replace('out', 'inputs', 1)}")

        # refill the same input tensors with new values; the next output must follow them
        out_a_copy = _clone(out_a)
        fresh = ev._inputs(seed + 1)
        guards.refill_in_place(inputs, fresh)
        if self.gcfg.refill_inputs:
            self.checked.append("stale_output_on_refill")
            self._refill_check(inputs, "after correctness")
        for (name, o), (_, o0) in zip(guards.tensors(out_a), guards.tensors(out_a_copy)):
            if not guards.same_values(o, o0) and "output_aliases_input" not in self.flags:
                self.flag("output_changed_later", f"output {name} of one call changed when ModelNew ran again "
                          "(it is a persistent buffer that later calls overwrite)")
                break
        new_threads = [t for t in guards.python_threads() - threads_before if t.is_alive()]
        if new_threads:
            self.flag("background_threads", f"ModelNew left {len(new_threads)} Python thread(s) running "
                      f"({', '.join(t.name for t in new_threads[:3])}): work that may escape the timer")
        return self._guard_verdict(Stage.CORRECTNESS)

    def _refill_check(self, inputs: Any, when: str) -> None:
        ev = self.ev
        ref_in = _clone(inputs)
        with torch.no_grad():
            ref_out = ev.ref_model(*ref_in)
            ev._sync()
            with guards.nan_fill(self.nan_fill_on):
                cand_out = ev.cand_model(*inputs)
            ev._sync()
        from kernelwright.engine.child.compare import compare_outputs

        report = compare_outputs(cand_out, ref_out, self.cfg.atol, self.cfg.rtol)
        ok, message, _ = self.judge_outputs(_clone(ref_in), cand_out, ref_out, report, localize_failure=False)
        if not ok:
            first = message.strip().splitlines()[0] if message.strip() else ""
            self.flag("stale_output_on_refill", f"inputs refilled in place with new values (same tensors, same "
                      f"addresses) {when} gave a wrong output: {first}")

    # ---- timing ----------------------------------------------------------------------------------
    def before_timing(self) -> bool:
        if not self.gcfg.enabled:
            return True
        self.check_patches("before timing")
        return self._guard_verdict(Stage.TIMING)

    def timed_output_check(self):
        if not (self.gcfg.enabled and self.gcfg.check_timed_outputs) or self.expected is None:
            return None
        self.checked.append("timed_output_mismatch")
        return guards.TimedOutputCheck(self.expected, self.cfg.atol, self.cfg.rtol,
                                       self.ncfg.factor * self.ref_err_scale)

    def after_timing(self, stats: dict, inputs: Any, candidate_fn, check) -> bool:
        """Guards on the timed runs; False (verdict set, speed-up withdrawn) when one fails."""
        ev = self.ev
        if not self.gcfg.enabled:
            return True
        self.check_patches("during timing")
        if check is not None:
            bad = check.mismatches()
            self.facts["timed_calls_checked"] = check.calls
            if bad:
                self.flag("timed_output_mismatch", f"{bad} wrong output elements over {check.calls} timed calls of ModelNew "
                          "(its outputs during timing differ from its verified output on the same inputs)")
        if ev.device.type == "cuda":
            self.checked.append("timer_escape")
            # [verdicts] confirmed before it fails: rounds of interleaved candidate/reference calls, each
            # call timed on the host and by events at once; stop at the first round that shows no escape
            rounds = []
            for _ in range(self.gcfg.escape_rounds):
                rounds.append(guards.measure_escape_round(candidate_fn, lambda: ev.ref_model(*inputs), ev.device))
                verdict = guards.judge_escape(rounds, self.gcfg.escape_ratio, confirm=self.gcfg.escape_rounds)
                if not guards.round_escapes(verdict.rounds[-1], self.gcfg.escape_ratio, 0.05):
                    break
            self.facts["timer"] = {"event_median_ms": stats["candidate"].median_ms, "rounds": verdict.rounds}
            if verdict.escaped:
                self.flag("timer_escape", verdict.detail)
        if self.gcfg.refill_inputs:
            fresh = ev._inputs(ev.cfg.seed + GUARD_SEED_OFFSET + 2)
            guards.refill_in_place(inputs, fresh)
            self._refill_check(inputs, "after timing")
        ok = self._guard_verdict(Stage.TIMING)
        if not ok:
            for key in ("speedup", "candidate_ms", "speedup_vs_compile"):
                ev.rec[key] = None
        return ok
