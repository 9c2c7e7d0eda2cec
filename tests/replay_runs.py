"""A replayable run for CLI tests that need no model and no engine: recorded Coder and Judge
answers (`recorded_answers`), and an engine stand-in that reads the speed-up off the code
(`FakeEngine`), so `kernelwright optimize` runs in-process in a fraction of a second."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from typer.testing import CliRunner

from conftest import ADD_ONE
from kernelwright.cli.main import app
from kernelwright.core.record import EvalResult, Status, TimingStats

SPEEDS = ["WRONG", "1.0", "1.6", "1.2"]  # round 0 incorrect: no best yet when it is interrupted after it


def _code(speed: str) -> str:
    return f"import torch\nimport torch.nn as nn\n\n# SPEED={speed}\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"  # noqa: E501


def recorded_answers(root: Path, speeds: list[str] = SPEEDS) -> Path:
    """A run directory as replay reads it: one folder per round with the Coder's and Judge's answers."""
    for i, speed in enumerate(speeds):
        folder = root / f"{i:03d}_{i:08x}"
        folder.mkdir(parents=True)
        (folder / "coder_response.md").write_text(f"Round {i}.\n```python\n{_code(speed)}```\n")
        body = (
            {"critical_issue": "wrong", "why_it_matters": "all", "minimal_fix_hint": "fix"}
            if speed == "WRONG"
            else {"bottleneck": f"b{i}", "optimisation": f"o{i}", "expected_speedup": 1.5}
        )
        (folder / "judge_response.md").write_text("```json\n" + json.dumps(body) + "\n```\n")
    return root


class FakeEngine:
    """Reads SPEED=x off the candidate; raises KeyboardInterrupt (Ctrl-C) at evaluation `interrupt_at`."""

    def __init__(self, interrupt_at: int | None = None):
        self.calls, self.interrupt_at = 0, interrupt_at
        self.output = ""  # the console output of the run it served (`optimize_suite`)

    def close(self) -> None:
        pass

    def __call__(self, problem, code, on_stage, report_dir) -> EvalResult:
        self.calls += 1
        time.sleep(0.05)
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        m = re.search(r"SPEED=([\d.]+)", code)
        meta = {"torch_version": "2.13.0+cpu", "cuda_version": "", "python": "3.11.7"}  # as the engine records them
        if not m:
            return EvalResult(
                status=Status.INCORRECT,
                error_log="Outputs are not close (atol=0.001, rtol=0.001)",
                device="cpu (fake engine)",
                device_type="cpu",
                metadata=meta,
            )
        s = float(m.group(1))
        t = TimingStats(
            median_ms=1 / s,
            mean_ms=1 / s,
            std_ms=0,
            min_ms=1 / s,
            max_ms=1 / s,
            p10_ms=1 / s,
            p90_ms=1 / s,
            iterations=10,
            warmup=3,
            clock="perf_counter",
            l2_flush=False,
        )
        return EvalResult(
            status=Status.PASSED,
            correct=True,
            speedup=s,
            candidate_ms=1 / s,
            reference_ms=1.0,
            candidate_timing=t,
            device="cpu (fake engine)",
            device_type="cpu",
            metadata=meta,
        )


def optimize(monkeypatch, engine: FakeEngine, answers: Path, *args: str, problem: Path = ADD_ONE):
    monkeypatch.setattr("kernelwright.loop.forge.engine_evaluator", lambda cfg, warm=True: engine)
    return CliRunner().invoke(
        app,
        [
            "optimize",
            str(problem),
            "--coder",
            f"replay:{answers}",
            "--device",
            "cpu",
            "--sandbox",
            "none",
            "--no-profile",
            *args,
        ],
    )


def optimize_suite(monkeypatch, root: Path, suite: str, problems: list[tuple[str, str, list[str], FakeEngine]]) -> Path:
    """A suite of `optimize` runs in the store `root/kw.db`, one per (level, problem, the Coder's
    answers round by round, its engine), each indexed under `suite`: the store's path. Each engine
    keeps its run's console output (`output`)."""
    from kernelwright.store.db import Store
    from kernelwright.store.indexer import index_run
    from kernelwright.suites.driver import register_suite

    path = root / "kw.db"
    with Store.open(path) as db:
        register_suite(db, suite, "optimize", ["fixtures"], root / suite)
        for level, name, speeds, engine in problems:
            run = root / suite / level / name
            answers = recorded_answers(root / "answers" / name, speeds)
            args = ("--rounds", str(len(speeds)), "--out", str(run), "--store", str(path))
            out = optimize(monkeypatch, engine, answers, *args)
            assert out.exit_code == 0, out.output
            engine.output = out.output
            index_run(db, run, suite_id=suite, problem=name, level=level)
    return path
