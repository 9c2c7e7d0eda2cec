"""Other sizes of the problem (`shapes.py`): the last checks of a passed candidate, one trial at
each size derived from the problem's constants, after timing and evidence, so that a crash or a
lost device at another size takes nothing the candidate earned at its own.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kernelwright.core.record import Stage, Status
from kernelwright.engine.child import numerics, protocol, shapes
from kernelwright.engine.child.judge_outputs import JudgeOutputs
from kernelwright.engine.child.judge_state import first_line
from kernelwright.engine.child.problem_io import in_mode, sync, trial_seed
from kernelwright.engine.child.trees import clone
from kernelwright.engine.child.wire import WireError


class JudgeShapes(JudgeOutputs):
    def shapes_or_stop(self) -> None:
        """The last checks of a passed candidate, then stop: one trial at each other size derived
        from the problem's constants (`EvalConfig.shapes`). They come after timing and evidence, so
        that a crash or a lost device at another size takes nothing the candidate earned at its own."""
        if self.cfg.shapes == "off":
            self.rec.metadata["shapes"] = {"mode": "off"}
        if (
            self.shape_plan is not None
            or self.cfg.shapes == "off"
            or not self.checks_passed
            or self.verdict_set
            or self.failing_guards()
        ):
            self.ask("stop")
            return

        t0 = time.perf_counter()
        try:
            self.shape_plan = self.plan_shapes()
        except Exception as exc:  # the judge's own trouble with the problem: the verdict at its own size stands
            self.rec.metadata["shapes"] = {
                "mode": self.cfg.shapes,
                "note": f"the other sizes could not be derived: {type(exc).__name__}: {str(exc)[:300]}",
            }
            self.ask("stop")
            return
        finally:
            self.busy_s["shapes_plan"] = time.perf_counter() - t0
        self.checked.append("shape_specific")
        for v in self.shape_plan.variants:
            model = ""
            if v.init_changed:  # init sizes change: a new ModelNew, kept by the runner under this label
                init = self.write_inputs(f"in_{v.label}_init.kwt", v.init_inputs)
                self.ask(
                    protocol.to_line(
                        protocol.Construct(init=init, seed=self.cfg.seed, label=v.label, mode=self.io.model_mode)
                    )
                )
                model = v.label
            self.expected.add(v.label)
            inputs = self.write_inputs(f"in_{v.label}.kwt", v.inputs)
            v.inputs = None  # in the runner's file now; the judge keeps only the outputs it compares with
            self.ask(protocol.to_line(protocol.Call(label=v.label, inputs=inputs, model=model, probe=True)))
        self.shapes_after()

    def plan_shapes(self) -> Any:
        """The sizes the reference accepts, with its outputs there (shapes.derive)."""

        def forward(model: Any, inputs: Any) -> Any:
            with torch.no_grad():
                out = model(*clone(inputs))
            sync(self.device)
            return out

        def init() -> Any:
            torch.manual_seed(self.cfg.seed)
            return self.problem.get_init_inputs()

        def construct(init_inputs: Any) -> Any:
            torch.manual_seed(self.cfg.seed)
            return in_mode(self.problem.Model(*init_inputs).to(self.device), self.io.model_mode)

        def oracle(model: Any, inputs: Any) -> Any:
            if not self.cfg.numerics.oracle or self.oracle_error:
                return None
            try:
                dtype = numerics.oracle_dtype(self.cfg.numerics.oracle_dtype)
                upcast = (
                    self.oracle
                    if model is self.ref_model and self.oracle is not None
                    else numerics.build_oracle(model, dtype)
                )
                out = numerics.run_oracle(upcast, inputs, dtype)
                sync(self.device)
                return out
            except Exception:  # judged against the reference alone there (strict)
                return None

        _, _, base_inputs = self.reference(trial_seed(self.secret, 0))
        seeds = [trial_seed(self.secret, 900 + i) for i in range(shapes.MAX_VARIANTS)]
        return shapes.derive(
            self.problem,
            base_model=self.ref_model,
            base_init=self.init_inputs,
            base_inputs=base_inputs,
            seeds=seeds,
            draw=self.io.inputs,
            init=init,
            construct=construct,
            forward=forward,
            oracle=oracle,
        )

    def shape_variant(self, label: str) -> Any:
        return next(v for v in self.shape_plan.variants if v.label == label)

    def shape_output(self, label: str, file: Any) -> None:
        self.expected.discard(label)
        v = self.shape_variant(label)
        try:
            cand = self.read(file)
        except WireError as exc:
            self.shape_results[label] = {
                "passed": False,
                "failure": "unreadable",
                "message": f"the output could not be read: {exc}",
            }
        else:
            flags = dict(self.flags)
            try:  # the same rule as a trial; localisation's hints at another size are not flags of this one
                j = self.compare(cand, v.ref_out, v.oracle_out, localize=True)
                passed, message = j.passed, j.message
            finally:
                self.flags = flags
            self.shape_results[label] = (
                {"passed": True} if passed else {"passed": False, "failure": "wrong_values", "message": message[:4000]}
            )
        self.shapes_after()

    def shape_error(self, label: str, message: str, lost: bool = False) -> None:
        if label not in self.expected:  # its model failed to construct: already recorded
            return
        self.expected.discard(label)
        self.shape_results[label] = {
            "passed": None if lost else False,
            "failure": "not_run" if lost else "error",
            "message": message,
        }
        self.shapes_after()

    def shapes_after(self) -> None:
        if any(v.label in self.expected for v in self.shape_plan.variants):
            return
        self.conclude_shapes()
        self.ask("stop")

    def shapes_ended(self, ended: dict[str, Any]) -> dict[str, Any]:
        """The runner ended (crashed, was killed at its deadline) during a call at another size:
        that size's failure, not the verdict's. `ended` as `finish` then reads it."""
        plan = self.shape_plan
        pending = [v for v in plan.variants if v.label in self.expected] if plan is not None else []
        if not pending or ended.get("protocol"):
            return ended
        timed_out = ended.get("timed_out_stage")
        how = f"timed out (stage limit {ended.get('limit_s', 0):g} s)" if timed_out else (ended.get("how") or "ended")
        self.shape_results[pending[0].label] = {
            "passed": False,
            "failure": "timeout" if timed_out else "crash",
            "message": f"the candidate's process {how} while ModelNew ran at these sizes",
        }
        for v in pending[1:]:
            self.shape_results[v.label] = {
                "passed": None,
                "failure": "not_run",
                "message": f"not run: the process had ended at {pending[0].name}",
            }
        self.expected -= {v.label for v in pending}
        self.conclude_shapes()
        self.done = True
        return dict(ended, how="", timed_out_stage=None)

    def conclude_shapes(self) -> None:
        """metadata["shapes"], the `shape_specific` flag, and under `strict` the verdict."""
        plan = self.shape_plan
        tried = []
        for v in plan.variants:
            r = self.shape_results.get(v.label, {"passed": None, "failure": "not_run", "message": "no answer"})
            tried.append({"sizes": dict(v.sizes), "name": v.name, "why": v.why, "new_model": v.init_changed, **r})
        failed = [t for t in tried if t["passed"] is False]
        own = ", ".join(f"{k}={v}" for k, v in plan.constants.items())
        self.rec.metadata["shapes"] = {
            "mode": self.cfg.shapes,
            "constants": dict(plan.constants),
            "batch": plan.batch,
            "tried": tried,
            "passed": [t["name"] for t in tried if t["passed"]],
            "failed": [t["name"] for t in failed],
            "dropped": list(plan.dropped),
            "note": plan.note or None,
        }
        if not failed:
            return
        words = {
            "wrong_values": "wrong values",
            "error": "an error",
            "crash": "a crash",
            "timeout": "a time-out",
            "unreadable": "an unreadable output",
        }
        detail = "; ".join(
            f"{t['name']} ({words.get(t['failure'], t['failure'])}: {first_line(t['message'])[:200]})"
            for t in failed[:4]
        )
        self.flag("shape_specific", f"ModelNew is correct at the problem's own sizes ({own}) but not at {detail}")
        if self.cfg.shapes == "strict":
            first = failed[0]
            self.set_verdict(
                Status.INCORRECT,
                f"ModelNew is correct at the problem's own sizes ({own}) but not at "
                f"other sizes (--shapes strict): {', '.join(t['name'] for t in failed)}\n"
                f"  at {first['name']}: {first['message']}",
                Stage.CORRECTNESS,
            )
