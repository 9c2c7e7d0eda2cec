"""The checks' sequence: every check sent once the candidate imports (`r_compiled`), each trial's
output judged as it comes (`trial`), then, once every report is in (`after_report`), timing,
evidence and the other sizes, or, after a wrong output, the ablation that says which parameter
the mismatch follows.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import torch

from kernelwright.core.record import Stage, Status, TrialRecord
from kernelwright.engine.child import protocol
from kernelwright.engine.child.compare import compare_outputs, flatten
from kernelwright.engine.child.correctness import errors
from kernelwright.engine.child.judge_guards import JudgeGuards
from kernelwright.engine.child.judge_shapes import JudgeShapes
from kernelwright.engine.child.judge_state import ReferenceFailure, dict_field, plain_data, short_tb, text
from kernelwright.engine.child.judge_timing import JudgeTiming
from kernelwright.engine.child.problem_io import guard_seeds, trial_seed
from kernelwright.engine.child.trees import clone
from kernelwright.engine.child.wire import WireError

BORDERLINE = 2.0  # a trial's error within this factor of the tolerance's edge, either side, is borderline
GUARD_CALLS = 4  # the guards' two calls of the candidate, counted twice: one runs traced (slower)


class JudgeTrials(JudgeTiming, JudgeShapes, JudgeGuards):
    def r_compiled(self, msg: dict[str, Any]) -> None:
        """The candidate imported: send every check at once (the runner answers in order)."""
        self.rec.compiled = True
        self.take_turn()  # (on a GPU: one evaluation drives it at a time, from its first check on)
        try:  # before the reference's first checked call: as constructed, or eval where it draws at random
            mode = self.io.settle_mode(self.ref_model, trial_seed(self.secret, 0))
        except Exception as exc:
            raise ReferenceFailure(short_tb(exc)) from exc
        self.checked.append("random_reference")
        if "model_mode" in self.rec.metadata:
            self.flag("random_reference", self.rec.metadata["model_mode"]["why"])
        if self.io.draws_in_eval:  # its own noise is no measure of rounding: the calibrated rule would widen to it
            self.cfg = dataclasses.replace(self.cfg, verdict="strict")
            self.numerics["verdict"] = "strict"
        init = self.write_inputs("in_init.kwt", self.init_inputs)
        cmds: list[Any] = [protocol.Construct(init=init, seed=self.cfg.seed, mode=mode)]
        for t in range(self.cfg.trials):
            seed = trial_seed(self.secret, t)
            cmds.append(protocol.Call(label=f"trial{t}", inputs=self.inputs_file(seed)))
            self.expected.add(f"trial{t}")
        if self.cfg.guards.enabled:
            seeds = guard_seeds(self.secret)
            refill = self.inputs_file(seeds["refill"]) if self.cfg.guards.refill_inputs else ""
            cmds.append(protocol.Guards(inputs=self.inputs_file(seeds["call"]), refill=refill))
            self.expected.add("guards")
        for c in cmds:
            self.ask(protocol.to_line(c))
        self.limit_correctness(calls=GUARD_CALLS if self.cfg.guards.enabled else 1)

    def limit_correctness(self, calls: int) -> None:
        """The most time a correctness command of the runner (a trial: one call; the guards: `calls`)
        may take before its report, from the reference's own time (StageTimeouts.call_floor,
        call_factor; jit_allowance before the first report of a candidate that compiles at its first
        call): a kernel that never returns is stopped within seconds, not at the stage's flat limit."""
        t = self.cfg.timeouts
        if t.call_factor <= 0 or not self.ref_call_s:
            return
        per_call = statistics.median(self.ref_call_s[1:] or self.ref_call_s)  # the first call warms up
        limit = min(max(t.call_floor, t.call_factor * per_call * calls), t.correctness)
        first = t.jit_allowance if self.job.candidate_jit else 0.0
        self.rec.metadata["correctness_limit_s"] = round(limit, 3)
        if first:
            self.rec.metadata["correctness_first_call_extra_s"] = first
        self.chan.send("limit", stage="correctness", s=limit, first_extra_s=first)

    def r_call_error(self, msg: dict[str, Any]) -> None:
        label = msg.get("label")
        if isinstance(label, str) and label.startswith("shape") and msg.get("probe") is True:
            return self.shape_error(label, text(msg.get("message"), 500), lost=msg.get("lost") is True)
        if isinstance(label, str) and label.startswith("trial") and label[5:].isdigit():
            t = int(label[5:])
            self.rec.trials.append(
                TrialRecord(
                    trial=t, seed=trial_seed(self.secret, t), passed=False, message=text(msg.get("message"), 500)
                )
            )
        self.expected.clear()

    def r_output(self, msg: dict[str, Any]) -> None:
        label = msg.get("label")
        if isinstance(label, str) and label in self.expected and label.startswith("shape"):
            return self.shape_output(label, msg.get("file"))
        if not (isinstance(label, str) and label in self.expected and label.startswith("trial")):
            return
        self.expected.discard(label)
        self.trial(int(label[5:]), msg.get("file"))
        self.after_report()

    def trial(self, t: int, file: Any) -> None:
        seed = trial_seed(self.secret, t)
        ref_out, oracle_out, inputs = self.reference(seed)
        trial = TrialRecord(trial=t, seed=seed, passed=False)
        try:
            cand = self.read(file)
        except WireError as exc:
            trial.message = f"The candidate's output for trial {t} could not be read: {exc}"
            self.add_trial(trial)
            return
        first = self.first_failure is None
        j = self.compare(cand, ref_out, oracle_out, localize=first)
        passed, message, evidence, strict = j.passed, j.message, j.evidence, j.strict
        trial.passed, trial.message = passed, message
        trial.extra["numerics"] = evidence
        if j.margin is not None and math.isfinite(j.margin):
            trial.extra["margin"] = round(j.margin, 4)
        if strict is not None and strict.leaves:
            worst = strict.worst
            trial.max_abs_err, trial.mean_abs_err = strict.max_abs_err, strict.mean_abs_err
            trial.worst_index = worst.worst_index if worst else None
            trial.worst_output = worst.name if worst else None
            trial.frac_out_of_tol = max((leaf.frac_out_of_tol or 0.0) for leaf in strict.leaves)
        s = self.numerics
        s["strict_passed"] = s["strict_passed"] and evidence.get("strict_passed", False)
        if "calibrated_passed" in evidence:
            s["calibrated_passed"] = s["calibrated_passed"] and evidence["calibrated_passed"]
            s["ill_conditioned"] = s["ill_conditioned"] or evidence.get("ill_conditioned", False)
        else:
            s["calibrated_passed"] = None
        self.degenerate.add(inputs, ref_out)
        if passed:  # how far a correct output of this candidate strays: the bound for its timed outputs
            self.timed_bound = self.timed_bound.widened(errors(cand, ref_out), cand, ref_out)
        self.add_trial(trial)

    def add_trial(self, trial: TrialRecord) -> None:
        self.rec.trials.append(trial)
        if not trial.passed and self.first_failure is None:
            self.first_failure = (trial.trial, trial.seed, trial.message)

    def after_report(self) -> None:
        """Once every check's output is in: the verdict so far, then timing or the end."""
        if self.expected or self.checks_done:
            return
        self.checks_done = True
        self.borderline()
        if self.verdict_set or self.first_failure is not None:
            if self.cfg.numerics.localize and self.first_failure and not self.ablation_asked:
                self.ask_ablation()
            else:
                self.ask("stop")
            return
        if len([tr for tr in self.rec.trials if tr.passed]) < self.cfg.trials:
            self.set_verdict(
                Status.RUNTIME_ERROR,
                f"The runner reported fewer trials than were asked for ({len(self.rec.trials)}/{self.cfg.trials})",
                Stage.CORRECTNESS,
            )
            self.ask("stop")
            return
        self.checks_passed = True  # every output right: what is left to decide are the flags and the timing
        if self.failing_guards():
            self.ask("stop")
            return
        if self.cfg.time_candidate:
            self.timing_asked = True
            self.time_windows()
        if self.reported is None and (self.cfg.profile.enabled or self.cfg.profile.roofline):
            self.evidence()
            if self.cfg.profile.enabled:
                self.expected.add("evidence")
                self.ask(protocol.to_line(protocol.Profile(inputs=self.inputs_file(trial_seed(self.secret, 0)))))
                return
        self.shapes_or_stop()

    def borderline(self) -> None:
        """A verdict another draw of inputs could turn: every trial passed with the worst within
        BORDERLINE of the tolerance's edge, or the first failing trial failed within BORDERLINE
        times it. The margin (error over what the deciding rule allows) is in the flag and the
        record's numerics."""
        margins = [m for tr in self.rec.trials if isinstance(m := tr.extra.get("margin"), float)]
        if not margins:
            return
        failed = [tr for tr in self.rec.trials if not tr.passed]
        if not failed:
            worst = max(margins)
            self.numerics["margin"] = worst
            if worst * BORDERLINE >= 1.0:
                self.flag(
                    "borderline",
                    f"passed with its worst trial's error at {worst:.2f} of what the tolerance allows (1 is the "
                    "edge): another draw of inputs may fail it",
                )
            return
        first = min(failed, key=lambda tr: tr.trial)
        m = first.extra.get("margin")
        if isinstance(m, float):
            self.numerics["margin"] = m
            if m <= BORDERLINE:
                self.flag(
                    "borderline",
                    f"failed with trial {first.trial}'s error at {m:.2f} times what the tolerance allows: "
                    "another draw of inputs may pass it",
                )

    def ask_ablation(self) -> None:
        """Which parameter, zeroed in both models, makes the first failure go away (evidence for
        the Judge model): the runner zeroes it in ModelNew, the judge in its own reference."""
        self.ablation_asked = True
        assert self.first_failure is not None, "asked after a failed trial"
        t, seed, _ = self.first_failure
        names = [n for n, p in self.ref_model.named_parameters() if p.is_floating_point()][:8]
        if not names:
            self.ask("stop")
            return
        self.ablation_seed = seed
        self.expected.add("ablation")
        self.ask(protocol.to_line(protocol.Ablate(inputs=self.inputs_file(seed), params=names)))

    def r_ablation(self, msg: dict[str, Any]) -> None:
        if "ablation" not in self.expected:
            return
        self.expected.discard("ablation")
        files = dict_field(msg, "files")
        params = dict(self.ref_model.named_parameters())
        _, _, inputs = self.reference(self.ablation_seed)
        for name, file in list(files.items())[:8]:
            p = params.get(name)
            if p is None:
                continue
            saved = p.detach().clone()
            try:
                cand = self.read(file)
                with torch.no_grad():
                    p.zero_()
                    ref_out = self.ref_model(*clone(inputs))
                rep = compare_outputs(cand, ref_out, self.cfg.atol, self.cfg.rtol)
                nonzero = any(
                    isinstance(x, torch.Tensor) and x.numel() and bool(x.ne(0).any()) for _, x in flatten(ref_out)
                )
                if rep.passed and nonzero:
                    self.ablation_lines.append(
                        f"the mismatch disappears when parameter '{text(name, 100)}' is set "
                        f"to 0 in both models (outputs still non-zero): look at how "
                        f"'{text(name, 100)}' is used"
                    )
            except (WireError, RuntimeError, ValueError):
                pass
            finally:
                with torch.no_grad():
                    p.copy_(saved)
        self.ask("stop")  # the verdict is known: nothing the runner does now can change it

    def r_guards(self, msg: dict[str, Any]) -> None:
        if "guards" not in self.expected:
            return
        self.expected.discard("guards")
        try:
            self.guards_report(msg)
        finally:
            self.after_report()

    def r_evidence(self, msg: dict[str, Any]) -> None:
        if "evidence" in self.expected:
            self.expected.discard("evidence")
            self.shapes_or_stop()
        meta = msg.get("metadata")
        if isinstance(meta, dict):
            for k, v in meta.items():
                if k in (
                    "gpu_facts",
                    "reference_work",
                    "roofline",
                    "roofline_line",
                    "profile",
                    "gpu_facts_error",
                    "roofline_error",
                    "profile_error",
                ):
                    self.rec.metadata[k] = plain_data(v)

    def degenerate_check(self) -> None:
        """A reference whose output does not depend on its inputs makes any constant 'correct'."""
        self.checked.append("degenerate_reference")
        finding = self.degenerate.finding()
        if finding.degenerate and self.facts.get("timed_reference_outputs_vary"):
            # the trials' outputs were all alike, but the timing stage's many draws were not: a
            # reference that rarely leaves one output (a ReLU behind a large shift), not a constant
            self.facts["degenerate_reference"] = "the trials' outputs were identical; the timed draws' were not"
            return
        if finding.degenerate:
            self.flag("degenerate_reference", finding.reason)
