"""The run store: one SQLite file (WAL mode) that indexes what run directories hold.

    store = Store.open("runs/kernelwright.db")
    with store.transaction() as tx:          # all or nothing
        tx.execute("INSERT INTO ...")

Plain tables a person can query with `sqlite3`: suites, runs, rounds, candidates (source hash and
code), evaluations (the full record as JSON beside its key columns), profiles and model_calls.
The run directory's files stay the source; the store is an index of them (`indexer.py`), rebuilt
for a run whenever the run writes a round. Every write is one transaction, and WAL with
synchronous=FULL means a process killed at any moment leaves the last committed state readable.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS suites (
    id TEXT PRIMARY KEY,            -- the suite's name
    kind TEXT NOT NULL,             -- eval | optimize
    problems TEXT NOT NULL,         -- the PROBLEMS argument(s), as given
    candidates TEXT,                -- suite eval: the CANDIDATES argument
    out_dir TEXT NOT NULL,
    created REAL NOT NULL,
    info TEXT NOT NULL DEFAULT '{}' -- JSON: settings (device, trials, coder, rounds, ...)
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,            -- the run directory's resolved path
    suite_id TEXT REFERENCES suites(id),
    kind TEXT NOT NULL,             -- optimize | eval
    problem TEXT NOT NULL,          -- the problem's name (file stem)
    level TEXT,                     -- KernelBench level folder (level1, ...) when there is one
    problem_path TEXT,
    run_dir TEXT NOT NULL,
    coder TEXT, judge TEXT,
    state TEXT NOT NULL,            -- running | finished
    stop_reason TEXT,
    rounds_run INTEGER NOT NULL DEFAULT 0,
    best_round INTEGER,
    best_speedup REAL,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    wall_s REAL,
    started TEXT,
    updated REAL NOT NULL,
    info TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS candidates (
    hash TEXT PRIMARY KEY,          -- sha256 of the code
    code TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    dir TEXT,
    kind TEXT,
    verdict TEXT NOT NULL,
    speedup REAL,
    became_best INTEGER NOT NULL DEFAULT 0,
    best_decision TEXT,
    candidate_hash TEXT REFERENCES candidates(hash),
    critique TEXT,                  -- JSON: the Judge's parsed answer
    judge_error TEXT,
    expectation TEXT,               -- JSON
    tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    wall_s REAL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    round_idx INTEGER NOT NULL,
    candidate_hash TEXT REFERENCES candidates(hash),
    status TEXT NOT NULL,
    correct INTEGER NOT NULL,
    speedup REAL,
    speedup_vs_compile REAL,
    candidate_ms REAL,
    reference_ms REAL,
    device TEXT,
    degenerate INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL,           -- JSON: the full EvalResult
    UNIQUE (run_id, round_idx)
);
CREATE TABLE IF NOT EXISTS profiles (
    evaluation_id INTEGER PRIMARY KEY REFERENCES evaluations(id) ON DELETE CASCADE,
    source TEXT,
    data TEXT NOT NULL              -- JSON: metadata["profile"]
);
CREATE TABLE IF NOT EXISTS model_calls (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    round_idx INTEGER NOT NULL,
    role TEXT NOT NULL,             -- coder | judge
    model TEXT,
    prompt_tokens INTEGER, completion_tokens INTEGER,
    cost_usd REAL,
    latency_s REAL,                 -- all attempts together
    attempts INTEGER,
    error TEXT
);
CREATE INDEX IF NOT EXISTS runs_suite ON runs(suite_id);
CREATE INDEX IF NOT EXISTS evaluations_run ON evaluations(run_id);
CREATE INDEX IF NOT EXISTS calls_run ON model_calls(run_id);
"""


class StoreError(RuntimeError):
    """The store cannot be used. One line naming the fix."""


class Store:
    """One SQLite store. Open it with `Store.open(path)`; close it with `close()` (or `with`)."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.conn, self.path = conn, path

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False) -> Store:
        path = Path(path)
        try:
            if readonly:
                if not path.is_file():
                    raise StoreError(f"no run store at {path}; pass --store with the file a suite or run wrote")
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(path, timeout=30, isolation_level=None)  # transactions are explicit
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the run store {path} ({exc}); pass a writable --store") from None
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys=ON")
        store = cls(conn, path)
        if not readonly:
            try:
                store._setup()
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise StoreError(f"{path} is not a usable run store ({exc}); move it aside and run again") from None
        return store

    def _setup(self) -> None:
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")  # a committed transaction survives a kill (and a power cut)
        with self.transaction() as tx:
            tx.executescript_safe(SCHEMA)
            row = tx.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise StoreError(
                    f"the run store {self.path} has schema version {row[0]}, this kernelwright "
                    f"reads {SCHEMA_VERSION}; use a new --store"
                )

    @contextmanager
    def transaction(self) -> Iterator[_Tx]:
        """BEGIN IMMEDIATE ... COMMIT; a failure (or an interrupt) rolls the whole transaction back."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield _Tx(self.conn)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def query(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    def integrity_check(self) -> str:
        """`PRAGMA integrity_check`: "ok" for a sound file."""
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Tx:
    """The connection inside a transaction (executescript would commit; statements go one by one)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def execute(self, sql: str, params: tuple | dict = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executescript_safe(self, script: str) -> None:
        for statement in script.split(";"):
            if statement.strip():
                self.conn.execute(statement)


def now() -> float:
    return time.time()
