"""The run directory: everything a run did, in files a person can read (and replay can play).

RUN/
  problem.py              the reference problem, as given
  run.json                how the run was started (models, backend, device, settings)
  000_<hash>/             one folder per round, in order; <hash> is the candidate's (or answer's)
    coder_prompt.md       what the Coder was asked
    coder_response.md     its raw answer (replay plays these back)
    candidate.py          the code extracted from the answer (when there was a code block)
    eval.json             the evaluation record (a format_error caught before the engine too)
    judge_prompt.md       what the Judge was asked, when it was asked
    judge_response.md     its raw answer
    profile/              ncu's raw report (profile.ncu-rep), its CSV and log, when ncu profiled the round
    round.json            kind, verdict, parsed critique, why it became (or did not become) the best,
                          the Judge's earlier expected speedup against what this round measured,
                          tokens, cost and every call attempt
    candidates/           only when a round has several candidates (--candidates K): one folder
      <i>_<hash>/         per Coder answer (coder_response.md, candidate.py, eval.json, profile/);
                          the round's own files above are those of the one the Judge reviewed
  best.py                 the fastest correct ModelNew so far, as a plain file
  summary.json            best speedup and its round, every round's verdict, tokens, cost
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import kernelwright
from kernelwright.core import run_files
from kernelwright.core.record import EvalResult
from kernelwright.core.run_files import BEST, RESPONSE_FILES, SUMMARY
from kernelwright.loop.history import Expectation, ModelCall, Round, RunState
from kernelwright.models.chat import Attempt, Completion, Usage
from kernelwright.models.extract import FailureCritique, PerformanceCritique
from kernelwright.models.replay import round_dirs
from kernelwright.store.files import write_public
from kernelwright.store.host import host_environment


class RunDirError(RuntimeError):
    """The run directory cannot be used. One line naming the fix."""


def problem_name(problem: str | Path) -> str:
    """A problem's name: its file's stem, or its folder's name when the file is `problem.py`
    (`examples/softmax/problem.py` is "softmax")."""
    path = Path(problem)
    if path.name == run_files.PROBLEM and path.parent.name not in ("", "."):
        return path.parent.name
    if path.name == run_files.PROBLEM:
        return path.resolve().parent.name or path.stem
    return path.stem


def default_run_dir(problem: Path, root: Path = Path("runs"), name: str | None = None) -> Path:
    return root / f"{name or problem_name(problem)}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _write(path: Path, text: str) -> None:
    """Write whole files only: a reader (or a crash) never sees half a summary; mode 0644 (no secrets)."""
    write_public(path, text)


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=True) + "\n"


class RunDir:
    """Implements the loop's Recorder: writes each round as it ends and the summary after it.
    `RunDir.reopen(path)` continues a run directory written before (see `load_rounds`)."""

    def __init__(self, path: str | Path, problem: Path, run_info: dict[str, Any]):
        self.path = Path(path)
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise RunDirError(f"run directory {self.path} already exists and is not empty; pass a new --out")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(
                f"cannot create run directory {self.path} ({exc.strerror}); pass a writable --out"
            ) from None
        self.problem = Path(problem)
        shutil.copyfile(self.problem, self.path / run_files.PROBLEM)
        self.run_info = {
            "kernelwright": kernelwright.__version__,
            "problem": str(self.problem),
            "started": datetime.now().isoformat(timespec="seconds"),
            "environment": host_environment(),
            **run_info,
        }
        _write(self.path / run_files.RUN_INFO, _json(self.run_info))
        self.dirs: dict[int, str] = {}

    # -- Recorder --
    def round_dir(self, rnd: Round) -> Path:
        """The round's folder (named by its code, so call it once the code is extracted; the first
        name given to a round stays, so a round of several candidates keeps one folder)."""
        folder = self.path / self.dirs.get(rnd.index, self.round_name(rnd))
        folder.mkdir(exist_ok=True)
        self.dirs[rnd.index] = folder.name
        return folder

    def record_round(self, rnd: Round, state: RunState) -> None:
        folder = self.round_dir(rnd)
        for cand in rnd.candidates:
            self._write_candidate(folder, cand)
        if rnd.coder:
            _write(folder / run_files.PROMPT_FILES["coder"], rnd.coder.prompt)
            if rnd.coder.response is not None:
                _write(folder / RESPONSE_FILES["coder"], rnd.coder.response)
        if rnd.code is not None:
            _write(folder / run_files.CANDIDATE, rnd.code)
        if rnd.result is not None:
            _write(folder / run_files.EVAL, rnd.result.to_json() + "\n")
        if rnd.judge:
            _write(folder / run_files.PROMPT_FILES["judge"], rnd.judge.prompt)
            if rnd.judge.response is not None:
                _write(folder / RESPONSE_FILES["judge"], rnd.judge.response)
        _write(folder / run_files.ROUND, _json(self._round_record(rnd)))
        if rnd.became_best and rnd.code is not None:
            _write(self.path / BEST, rnd.code)
        self.write_summary(state, final=False)

    def finish(self, state: RunState) -> None:
        self.write_summary(state, final=True)

    @staticmethod
    def _write_candidate(folder: Path, cand) -> None:
        basis = cand.code or (cand.coder.response if cand.coder and cand.coder.response else None) or str(cand.index)
        sub = folder / run_files.CANDIDATES_DIR / run_files.candidate_dir_name(cand.index, basis)
        sub.mkdir(parents=True, exist_ok=True)
        if cand.coder and cand.coder.response is not None:
            _write(sub / RESPONSE_FILES["coder"], cand.coder.response)
        if cand.code is not None:
            _write(sub / run_files.CANDIDATE, cand.code)
        if cand.result is not None:
            _write(sub / run_files.EVAL, cand.result.to_json() + "\n")

    # -- contents --
    @staticmethod
    def round_name(rnd: Round) -> str:
        basis = (
            rnd.code
            or (rnd.coder.response if rnd.coder and rnd.coder.response else None)
            or (rnd.coder.prompt if rnd.coder else str(rnd.index))
        )
        return f"{rnd.index:03d}_{hashlib.sha256(basis.encode()).hexdigest()[:8]}"

    def _round_record(self, rnd: Round) -> dict[str, Any]:
        coder_calls = [c.coder for c in rnd.candidates] if rnd.candidates else [rnd.coder]
        calls = [c for c in (*coder_calls, rnd.judge) if c is not None]
        tokens = sum(c.completion.usage.total_tokens for c in calls if c.completion)
        costs = [c.completion.cost_usd for c in calls if c.completion]
        priced = [c for c in costs if c is not None]
        return {
            "round": rnd.index,
            "dir": self.dirs.get(rnd.index),
            "kind": rnd.kind,
            "verdict": rnd.verdict,
            "evaluated": rnd.evaluated,
            "speedup": rnd.speedup,
            "summary": rnd.result.summary_line() if rnd.result else (rnd.coder.error if rnd.coder else ""),
            "became_best": rnd.became_best,
            "best_decision": rnd.best_decision or None,
            "expectation": dataclasses.asdict(rnd.expectation) if rnd.expectation else None,
            "expected_speedup": rnd.expectation.expected_speedup if rnd.expectation else None,
            "measured_over_baseline": rnd.expectation.measured_over_baseline if rnd.expectation else None,
            "expectation_held": rnd.expectation.held if rnd.expectation else None,
            "critique": dataclasses.asdict(rnd.critique) if rnd.critique else None,
            "judge_error": rnd.judge_error,
            "tokens": tokens,
            "cost_usd": sum(priced) if len(priced) == len(costs) else None,
            "wall_s": rnd.wall_s,
            "coder": rnd.coder.record() if rnd.coder else None,
            "judge": rnd.judge.record() if rnd.judge else None,
        } | (
            {
                "chosen": rnd.chosen,
                "chosen_why": rnd.chosen_why,
                "candidates": [self._candidate_record(c) for c in rnd.candidates],
            }
            if rnd.candidates
            else {}
        )

    @staticmethod
    def _candidate_record(cand) -> dict[str, Any]:
        basis = cand.code or (cand.coder.response if cand.coder and cand.coder.response else None) or str(cand.index)
        placed = (cand.result.metadata.get("executor") or {}) if cand.result is not None else {}
        return {
            "index": cand.index,
            "dir": f"{run_files.CANDIDATES_DIR}/{run_files.candidate_dir_name(cand.index, basis)}",
            "coder": cand.coder_name,
            "verdict": cand.verdict,
            "speedup": cand.speedup,
            "summary": cand.result.summary_line() if cand.result else (cand.coder.error if cand.coder else ""),
            "gpu": placed.get("gpu"),
            "host": placed.get("host"),
            "call": cand.coder.record() if cand.coder else None,
        }

    def _best_record(self, best: Round | None) -> dict[str, Any] | None:
        if best is None:
            return None
        result = best.result
        assert result is not None, "the best round is an evaluated, passed candidate"
        return {
            "round": best.index,
            "dir": self.dirs.get(best.index),
            "speedup": result.speedup,
            "speedup_withheld_by": result.speedup_withheld_by,  # flags that say the figure is not trusted
            "candidate_ms": result.candidate_ms,
            "reference_ms": result.reference_ms,
            "device": result.device,
            "file": BEST,
        }

    def write_summary(self, state: RunState, final: bool) -> dict[str, Any]:
        summary = {
            **self.run_info,
            "state": state.outcome if final else "running",  # finished | stopped (on an error, or no answer)
            "stop_reason": state.stop_reason,
            "error": state.error,
            "rounds_run": len(state.rounds),
            "best": self._best_record(state.best),
            "rounds": [
                {
                    k: v
                    for k, v in self._round_record(r).items()
                    if k not in ("coder", "judge", "critique", "expectation", "candidates")
                }
                | {"expectation_outcome": r.expectation.outcome if r.expectation else None}
                | {"attempts": {"coder": _attempts(r.coder), "judge": _attempts(r.judge)}}
                | ({"candidate_verdicts": [c.verdict for c in r.candidates]} if r.candidates else {})
                for r in state.rounds
            ],
            "tokens": {
                "prompt": state.usage.prompt_tokens,
                "completion": state.usage.completion_tokens,
                "total": state.usage.total_tokens,
            },
            "cost_usd": state.cost_usd,
            "unpriced_calls": state.unpriced_calls,
            "wall_s": round(state.wall_s, 3),
        }
        _write(self.path / SUMMARY, _json(summary))
        return summary

    # -- resume --
    @classmethod
    def reopen(cls, path: str | Path) -> tuple[RunDir, list[Round]]:
        """A run directory written before, ready to record more rounds, and its finished rounds.

        A round folder without `round.json` is a round cut off mid-way (a kill), and a last round
        with no result is one whose Coder call failed for good (the run stopped there): either is
        moved aside to `.cut-NNN_<hash>-TIME` (kept for a person to read, invisible to replay and
        the indexer) and done again.
        """
        path = Path(path)
        info_path = path / run_files.RUN_INFO
        if not info_path.is_file():
            raise RunDirError(
                f"no {run_files.RUN_INFO} in {path}; pass a run directory written by `kernelwright optimize`"
            )
        self = cls.__new__(cls)
        self.path = path
        self.run_info = json.loads(info_path.read_text())
        self.problem = path / run_files.PROBLEM
        rounds = load_rounds(path)
        while rounds and rounds[-1].result is None:  # a round the Coder never answered (the run stopped there): redo it
            rounds.pop()
        self.dirs = {r.index: self.round_name(r) for r in rounds}
        keep = set(self.dirs.values())
        for folder in round_dirs(path):
            if folder.name not in keep:
                os.replace(folder, path / f".cut-{folder.name}-{datetime.now().strftime('%Y%m%d%H%M%S%f')}")
        return self, rounds


# ---- reading a run directory back (resume) ----------------------------------------------------


def load_rounds(run_dir: str | Path) -> list[Round]:
    """The finished rounds of a run directory as the loop's `Round`s (what `Forge.restore` takes).

    Rounds count up to the first folder without a readable `round.json`: what follows a cut-off
    round is not trusted.
    """
    rounds: list[Round] = []
    for folder in round_dirs(Path(run_dir)):
        try:
            rec = json.loads((folder / run_files.ROUND).read_text())
        except (OSError, ValueError):
            break
        if rec.get("round") != len(rounds):
            break
        rounds.append(_round_from_files(folder, rec))
    return rounds


def _round_from_files(folder: Path, rec: dict[str, Any]) -> Round:
    def text(name: str) -> str | None:
        p = folder / name
        return p.read_text() if p.is_file() else None

    rnd = Round(index=int(rec["round"]), kind=rec.get("kind") or "first")
    rnd.coder = _call_from_files(
        "coder", rec.get("coder"), text(run_files.PROMPT_FILES["coder"]), text(RESPONSE_FILES["coder"])
    )
    rnd.judge = _call_from_files(
        "judge", rec.get("judge"), text(run_files.PROMPT_FILES["judge"]), text(RESPONSE_FILES["judge"])
    )
    rnd.code = text(run_files.CANDIDATE)
    ev = text(run_files.EVAL)
    rnd.result = EvalResult.from_json(ev) if ev is not None else None
    rnd.evaluated = bool(rec.get("evaluated"))
    crit = rec.get("critique")
    if crit:
        kind = PerformanceCritique if "bottleneck" in crit else FailureCritique
        names = {f.name for f in dataclasses.fields(kind)}
        rnd.critique = kind(**{k: v for k, v in crit.items() if k in names})
    rnd.judge_error = rec.get("judge_error")
    rnd.became_best = bool(rec.get("became_best"))
    rnd.best_decision = rec.get("best_decision") or ""
    if rec.get("expectation"):
        rnd.expectation = Expectation(**rec["expectation"])
    rnd.wall_s = float(rec.get("wall_s") or 0.0)
    return rnd


def _call_from_files(
    role: str, rec: dict[str, Any] | None, prompt: str | None, response: str | None
) -> ModelCall | None:
    if rec is None or prompt is None:
        return None
    call = ModelCall(role=role, prompt=prompt)
    if rec.get("error") is not None or response is None:
        call.error = rec.get("error") or "no response recorded"
        call.error_attempts = list(rec.get("attempts") or [])
        return call
    call.completion = Completion(
        text=response,
        usage=Usage(int(rec.get("prompt_tokens") or 0), int(rec.get("completion_tokens") or 0)),
        model=rec.get("model") or "",
        attempts=[Attempt(**a) for a in rec.get("attempts") or []],
        cost_usd=rec.get("cost_usd"),
        finish_reason=rec.get("finish_reason"),
    )
    return call


def _attempts(call) -> int:
    if call is None:
        return 0
    return len(call.completion.attempts) if call.completion else len(call.error_attempts)


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        raise RunDirError(f"no {SUMMARY} in {run_dir}; pass a directory written by `kernelwright optimize`")
    return json.loads(path.read_text())
