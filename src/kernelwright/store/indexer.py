"""Reading a run directory into the store: one transaction per run, replacing what the store held
for it. The files are the source; indexing twice gives the same rows.

A round folder counts once its `round.json` is written (the run directory writes it last, whole);
a folder without one is a round that was cut off and is not indexed. A round's verdict is read as a
`RoundVerdict`, its evaluation (`eval.json`) through `EvalResult.from_dict`: a record that does not
load as one is not indexed, as an unreadable file is not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kernelwright.core import run_files
from kernelwright.core.record import EvalResult, RoundVerdict
from kernelwright.models.replay import round_dirs
from kernelwright.store.db import Store, now
from kernelwright.store.rundir import problem_name


def degenerate(result: EvalResult) -> bool:
    """Does an evaluation flag its problem's reference as degenerate: the `degenerate_reference` guard,
    or the same finding under metadata["degenerate_reference"]?"""
    return bool(result.flags().get("degenerate_reference") or result.metadata.get("degenerate_reference"))


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _result(path: Path) -> EvalResult | None:
    """An evaluation record file, typed; None when it is unreadable or does not load as an EvalResult."""
    data = _load(path)
    if not isinstance(data, dict):
        return None
    try:
        return EvalResult.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def finished_rounds(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, round.json) of every round the run directory finished, in order."""
    out = []
    for folder in round_dirs(run_dir):
        rec = _load(folder / run_files.ROUND)
        if rec is not None:
            out.append((folder, rec))
    return out


def index_run(
    store: Store,
    run_dir: str | Path,
    *,
    suite_id: str | None = None,
    problem: str | None = None,
    level: str | None = None,
    kind: str | None = None,
) -> str:
    """Index one run directory (an `optimize` run or one problem of a suite); returns the run's id."""
    run_dir = Path(run_dir).resolve()
    info = _load(run_dir / run_files.RUN_INFO) or {}
    summary = _load(run_dir / run_files.SUMMARY) or {}
    rounds = finished_rounds(run_dir)
    run_id = str(run_dir)
    problem = problem or info.get("name") or problem_name(info.get("problem") or run_dir.name)
    best = summary.get("best") or {}
    tokens = sum(int(r.get("tokens") or 0) for _, r in rounds)
    costs = [r.get("cost_usd") for _, r in rounds]
    with store.transaction() as tx:
        old = tx.execute("SELECT suite_id, level FROM runs WHERE id=?", (run_id,)).fetchone()
        if old is not None:
            suite_id = suite_id or old["suite_id"]
            level = level or old["level"]
        tx.execute("DELETE FROM runs WHERE id=?", (run_id,))  # cascades to rounds, evaluations, calls
        tx.execute(
            "INSERT INTO runs (id, suite_id, kind, problem, level, problem_path, run_dir, coder, judge, state,"
            " stop_reason, rounds_run, best_round, best_speedup, tokens, cost_usd, wall_s, started, updated, info)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id,
                suite_id,
                kind or info.get("kind", "optimize"),
                problem,
                level,
                info.get("problem"),
                str(run_dir),
                info.get("coder"),
                info.get("judge"),
                summary.get("state", "running"),
                summary.get("stop_reason"),
                len(rounds),
                best.get("round"),
                best.get("speedup"),
                tokens,
                None if any(c is None for c in costs) else sum(costs),
                summary.get("wall_s"),
                info.get("started"),
                now(),
                json.dumps(info),
            ),
        )
        for folder, rec in rounds:
            idx = int(rec["round"])
            chash = None
            cand = folder / run_files.CANDIDATE
            if cand.is_file():
                code = cand.read_text()
                chash = code_hash(code)
                tx.execute("INSERT OR IGNORE INTO candidates (hash, code) VALUES (?, ?)", (chash, code))
            tx.execute(
                "INSERT INTO rounds (run_id, idx, dir, kind, verdict, speedup, became_best, best_decision,"
                " candidate_hash, critique, judge_error, expectation, tokens, cost_usd, wall_s)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    idx,
                    folder.name,
                    rec.get("kind"),
                    RoundVerdict(rec.get("verdict") or RoundVerdict.NOT_RUN).value,
                    rec.get("speedup"),
                    int(bool(rec.get("became_best"))),
                    rec.get("best_decision"),
                    chash,
                    json.dumps(rec.get("critique")) if rec.get("critique") else None,
                    rec.get("judge_error"),
                    json.dumps(rec.get("expectation")) if rec.get("expectation") else None,
                    int(rec.get("tokens") or 0),
                    rec.get("cost_usd"),
                    rec.get("wall_s"),
                ),
            )
            ev = _result(folder / run_files.EVAL)
            if ev is not None:
                cur = tx.execute(
                    "INSERT INTO evaluations (run_id, round_idx, candidate_hash, status, correct, speedup,"
                    " speedup_vs_compile, candidate_ms, reference_ms, device, degenerate, record)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        run_id,
                        idx,
                        chash,
                        ev.status.value,
                        int(ev.correct),
                        ev.speedup,
                        ev.speedup_vs_compile,
                        ev.candidate_ms,
                        ev.reference_ms,
                        ev.device,
                        int(degenerate(ev)),
                        json.dumps(ev.to_dict(), allow_nan=True),
                    ),
                )
                prof = ev.metadata.get("profile")
                if prof:
                    tx.execute(
                        "INSERT INTO profiles (evaluation_id, source, data) VALUES (?,?,?)",
                        (cur.lastrowid, prof.get("source") if isinstance(prof, dict) else None, json.dumps(prof)),
                    )
            for role in ("coder", "judge"):
                call = rec.get(role)
                if not call:
                    continue
                attempts = call.get("attempts") or []
                tx.execute(
                    "INSERT INTO model_calls (run_id, round_idx, role, model, prompt_tokens, completion_tokens,"
                    " cost_usd, latency_s, attempts, error) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        run_id,
                        idx,
                        role,
                        call.get("model") or info.get(role),
                        call.get("prompt_tokens"),
                        call.get("completion_tokens"),
                        call.get("cost_usd"),
                        round(sum(float(a.get("elapsed_s") or 0) for a in attempts), 3),
                        len(attempts),
                        call.get("error"),
                    ),
                )
    return run_id
