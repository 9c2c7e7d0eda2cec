"""The run store for notebooks and reports: plain rows (dicts), ready for `pandas.DataFrame(...)`.

    from kernelwright.store import open_store
    db = open_store()                # the user's store (see `default_store`), or open_store("path/to/kw.db")
    db.suites()                      # every suite: name, kind, problems, settings
    db.runs(suite="kb-l1")           # every run (one per problem of a suite), with its best result
    db.problems("kb-l1")             # one row per problem: best correct speedup, verdicts round by round
    db.evaluations(suite="kb-l1")    # every evaluation, the full record under "record" (typed: `result_of(row)`)
    db.rounds(run_id)                # one run's rounds, the Judge's findings included

`target` (for `problems`) is a suite's name or a run's id (its run directory).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kernelwright.core.record import EvalResult, RoundVerdict, Status, withheld_by
from kernelwright.store.db import Store, StoreError

STORE_ENV = "KERNELWRIGHT_STORE"
STORE_FILE = "kernelwright.db"


def data_dir() -> Path:
    """The platform's per-user data directory for kernelwright: $XDG_DATA_HOME/kernelwright
    (~/.local/share/kernelwright) on Linux, ~/Library/Application Support/kernelwright on macOS,
    %LOCALAPPDATA%\\kernelwright on Windows."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "kernelwright"
    if sys.platform.startswith("win"):
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "kernelwright"
    return Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "kernelwright"


def default_store() -> Path:
    """One store per user, so `kernelwright runs` lists every run wherever its folder is:
    $KERNELWRIGHT_STORE when set, else `data_dir()/kernelwright.db`. `--store` overrides both."""
    return Path(os.environ.get(STORE_ENV) or data_dir() / STORE_FILE).expanduser()


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_STORE":  # read when asked, so the environment variable set later counts
        return default_store()
    raise AttributeError(name)


def open_store(path: str | Path | None = None, readonly: bool = True) -> RunStore:
    """The run store at `path` (default: `default_store()`, made empty when there is none yet), for reading rows."""
    if path is None and not default_store().is_file():
        Store.open(default_store()).close()  # nothing run yet: an empty store, not an error
    return RunStore(Store.open(path or default_store(), readonly=readonly))


def load_record(record: dict[str, Any] | None) -> EvalResult | None:
    """A stored evaluation record, read through `EvalResult.from_dict`; None when there is none or it
    does not load as one (a file written by hand, a field no longer in the record)."""
    if not record:
        return None
    try:
        return EvalResult.from_dict(record)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def result_of(row: dict[str, Any]) -> EvalResult | None:
    """The typed record of a row of `RunStore.evaluations()` (None: it does not load, see `load_record`)."""
    return load_record(row.get("record"))


def kept_facts(record: dict[str, Any] | None) -> tuple[bool | None, list[str], list[float]]:
    """(`EvalResult.size_robust`, `sizes_failed`, `draw_speedups`) of a stored record; a record that
    does not load as an EvalResult is not known: (None, [], [])."""
    result = load_record(record)
    if result is None:
        return None, [], []
    return result.size_robust, result.sizes_failed, result.draw_speedups


def _withheld(evaluation: dict[str, Any]) -> list[str]:
    """The flags of an evaluation row (`guard_flags`, the record's JSON object) that withhold its speed-up."""
    raw = evaluation.get("guard_flags")
    try:
        flags = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        return []
    return withheld_by(flags) if isinstance(flags, dict) else []


def _row(r) -> dict[str, Any]:
    d = dict(r)
    for key in ("info", "critique", "expectation", "record"):
        if isinstance(d.get(key), str):
            d[key] = json.loads(d[key])
    return d


class RunStore:
    def __init__(self, store: Store):
        self.store = store

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def suites(self) -> list[dict[str, Any]]:
        return [_row(r) for r in self.store.query("SELECT * FROM suites ORDER BY created")]

    def suite(self, name: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT * FROM suites WHERE id=?", (name,))
        return _row(rows[0]) if rows else None

    def runs(self, suite: str | None = None) -> list[dict[str, Any]]:
        if suite is None:
            rows = self.store.query("SELECT * FROM runs ORDER BY updated")
        else:
            rows = self.store.query("SELECT * FROM runs WHERE suite_id=? ORDER BY level, problem", (suite,))
        return [_row(r) for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT * FROM runs WHERE id=?", (str(Path(run_id).resolve()),))
        rows = rows or self.store.query("SELECT * FROM runs WHERE id=?", (run_id,))
        return _row(rows[0]) if rows else None

    def rounds(self, run_id: str) -> list[dict[str, Any]]:
        return [
            _row(r)
            for r in self.store.query(
                "SELECT r.*, c.code FROM rounds r LEFT JOIN candidates c ON c.hash = r.candidate_hash"
                " WHERE r.run_id=? ORDER BY r.idx",
                (run_id,),
            )
        ]

    def evaluations(self, run: str | None = None, suite: str | None = None, full: bool = True) -> list[dict[str, Any]]:
        cols = (
            "e.*"
            if full
            else "e.id, e.run_id, e.round_idx, e.candidate_hash, e.status, e.correct, e.speedup,"
            " e.speedup_vs_compile, e.candidate_ms, e.reference_ms, e.device, e.degenerate,"
            # what the speed-up measures, and the calls as launched one at a time (the record's own fields)
            " json_extract(e.record, '$.speedup_basis') AS speedup_basis,"
            " json_extract(e.record, '$.speedup_as_launched') AS speedup_as_launched,"
            # the record's flags (an object: name -> evidence), for the ones that withhold the speed-up
            " json_extract(e.record, '$.metadata.guards.flags') AS guard_flags"
        )
        sql = f"SELECT {cols}, r.problem, r.level, r.suite_id FROM evaluations e JOIN runs r ON r.id = e.run_id"
        if run is not None:
            rows = self.store.query(sql + " WHERE e.run_id=? ORDER BY e.round_idx", (run,))
        elif suite is not None:
            rows = self.store.query(sql + " WHERE r.suite_id=? ORDER BY r.level, r.problem, e.round_idx", (suite,))
        else:
            rows = self.store.query(sql + " ORDER BY e.id")
        return [_row(r) for r in rows]

    def model_calls(self, run: str) -> list[dict[str, Any]]:
        return [_row(r) for r in self.store.query("SELECT * FROM model_calls WHERE run_id=? ORDER BY id", (run,))]

    def candidate(self, code_hash: str) -> str | None:
        rows = self.store.query("SELECT code FROM candidates WHERE hash=?", (code_hash,))
        return rows[0]["code"] if rows else None

    def problems(self, target: str) -> list[dict[str, Any]]:
        """One row per problem of a suite (or of one run): the fields of `suites.metrics.ProblemOutcome`."""
        suite = self.suite(target)
        if suite is not None:
            runs = self.runs(suite=target)
            missing = (suite.get("info") or {}).get("missing", [])
        else:
            one = self.run(target)
            if one is None:
                raise StoreError(
                    f"no suite or run named {target!r} in {self.store.path}; `kernelwright runs` lists them"
                )
            runs, missing = [one], []
        out = [self._problem(r) for r in runs]
        for m in missing:
            out.append(
                dict(
                    problem=m["problem"],
                    level=m.get("level"),
                    verdict=RoundVerdict.NO_CANDIDATE,
                    correct=False,
                    speedup=None,
                    speedup_vs_compile=None,
                    speedup_basis=None,
                    speedup_as_launched=None,
                    speedup_withheld_by=[],
                    verdicts=[],
                    speedups=[],
                    tokens=0,
                    cost_usd=0.0,
                    wall_s=None,
                    degenerate=False,
                    run_id=None,
                    best_round=None,
                    size_robust=None,
                    sizes_failed=[],
                    speedup_draws=[],
                )
            )
        return out

    def _problem(self, run: dict[str, Any]) -> dict[str, Any]:
        rounds = self.rounds(run["id"])
        evals = {e["round_idx"]: e for e in self.evaluations(run=run["id"], full=False)}
        # the run's best (the kernel the loop kept: best.py), else the fastest correct evaluation whose
        # speed-up the record does not withhold (then the fastest of the rest)
        best = evals.get(run["best_round"]) if run["best_round"] is not None else None
        if best is None or not (best["correct"] and best["status"] == Status.PASSED):
            correct = [e for e in evals.values() if e["correct"] and e["status"] == Status.PASSED]
            best = max(
                correct,
                key=lambda e: (e["speedup"] is not None, not _withheld(e), e["speedup"] or 0.0),
                default=None,
            )
        verdicts = [RoundVerdict(r["verdict"]) for r in rounds]
        robust: bool | None = None
        failed: list[str] = []
        drawn: list[float] = []
        if best is not None:  # the kept kernel's record: did it hold at the other sizes? its draws?
            rows = self.store.query("SELECT record FROM evaluations WHERE id=?", (best["id"],))
            robust, failed, drawn = kept_facts(_row(rows[0])["record"] if rows else None)
        return dict(
            problem=run["problem"],
            level=run["level"],
            verdict=RoundVerdict.PASSED if best is not None else (verdicts[-1] if verdicts else RoundVerdict.NOT_RUN),
            correct=best is not None,
            speedup=best["speedup"] if best else None,
            speedup_vs_compile=best["speedup_vs_compile"] if best else None,
            speedup_basis=best["speedup_basis"] if best else None,
            speedup_as_launched=best["speedup_as_launched"] if best else None,
            speedup_withheld_by=_withheld(best) if best else [],
            verdicts=verdicts,
            speedups=[r["speedup"] for r in rounds],
            tokens=run["tokens"] or 0,
            cost_usd=run["cost_usd"],
            wall_s=run["wall_s"],
            degenerate=any(e["degenerate"] for e in evals.values()),
            run_id=run["id"],
            best_round=best["round_idx"] if best else None,
            size_robust=robust,
            sizes_failed=failed,
            speedup_draws=drawn,
        )
