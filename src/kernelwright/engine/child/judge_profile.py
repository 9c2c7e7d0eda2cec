"""The evidence of a passed candidate: the device's facts, the reference's work, the roofline of the
judge's own candidate time (`evidence`), and the physics check of that time (`physics`: under the
roofline floor, `faster_than_hardware`, the speed-up is not trusted).
"""

from __future__ import annotations

from typing import Any

from kernelwright.core import roofline
from kernelwright.engine.child import evidence, gpu_facts
from kernelwright.engine.child.judge_outputs import JudgeOutputs
from kernelwright.engine.child.problem_io import trial_seed


class JudgeProfile(JudgeOutputs):
    def evidence(self) -> None:
        """Device facts, the reference's work and the roofline of the judge's own candidate time."""
        meta = self.rec.metadata
        try:
            facts = self.device_facts()
            meta["gpu_facts"] = facts
        except Exception as exc:
            meta["gpu_facts_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            facts = None
        if not self.cfg.profile.roofline:
            return
        try:
            _, _, inputs = self.reference(trial_seed(self.secret, 0))
            work = self.reference_work(inputs)
            meta["reference_work"] = work
            if facts is not None and self.rec.candidate_ms:
                peak_flops, peak_bw, source = roofline.choose_peaks(facts, work["precision"])
                if peak_bw:
                    r = roofline.compute(
                        work["flops"],
                        work["min_bytes"],
                        self.rec.candidate_ms,
                        peak_bw,
                        peak_flops,
                        source,
                        work["precision"],
                    )
                    meta["roofline"] = r.to_dict()
                    meta["roofline_line"] = roofline.line(r)
        except Exception as exc:
            meta["roofline_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"

    def device_facts(self) -> dict[str, Any]:
        if getattr(self, "_facts", None) is None:
            self._facts = gpu_facts.collect(self.device, self.cfg.cache_dir, measure=self.cfg.profile.measure_peaks)
        return self._facts

    def reference_work(self, inputs: Any) -> dict[str, Any]:
        if getattr(self, "_work", None) is None:
            self._work = evidence.cached_reference_work(
                self.ref_model,
                inputs,
                None,
                self.cfg.cache_dir,
                self.device,
                problem_text=self.job.problem_source,
            )
        return self._work
