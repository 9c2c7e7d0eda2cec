"""The forge loop's `Evaluator` on top of an executor: `Forge(..., evaluate=ExecutorEvaluator(ex))`.

It is `concurrent`: the loop may call it from several threads at once (the K candidates of a
round), and the executor spreads them over its GPUs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from kernelwright.core.record import EvalResult
from kernelwright.executors.interface import EvalTask, Executor


class ExecutorEvaluator:
    concurrent = True

    def __init__(self, executor: Executor):
        self.executor = executor

    def __call__(
        self, problem: Path, code: str, on_stage: Callable[[str], None], report_dir: Path | None
    ) -> EvalResult:
        key = f"{Path(problem).stem}/{hashlib.sha256(code.encode()).hexdigest()[:12]}"
        return self.executor.submit(
            EvalTask(key=key, problem=Path(problem), candidate_text=code, report_dir=report_dir), on_stage
        ).result()

    def close(self) -> None:
        self.executor.close()
