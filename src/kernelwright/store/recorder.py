"""The loop's recorder with the store kept up to date: the run directory writes each round's
files, then the store indexes them in one transaction (so the store never runs ahead of the files)."""

from __future__ import annotations

from pathlib import Path

from kernelwright.loop.history import Round, RunState
from kernelwright.store.db import Store
from kernelwright.store.indexer import index_run
from kernelwright.store.rundir import RunDir


class IndexingRecorder:
    def __init__(self, run_dir: RunDir, store: Store, **index_args):
        self.run_dir, self.store, self.index_args = run_dir, store, index_args
        self.path = run_dir.path
        self.index()

    def index(self) -> str:
        return index_run(self.store, self.run_dir.path, **self.index_args)

    def round_dir(self, rnd: Round) -> Path | None:
        return self.run_dir.round_dir(rnd)

    def record_round(self, rnd: Round, state: RunState) -> None:
        self.run_dir.record_round(rnd, state)
        self.index()

    def finish(self, state: RunState) -> None:
        self.run_dir.finish(state)
        self.index()

    def write_summary(self, state: RunState, final: bool) -> dict:
        summary = self.run_dir.write_summary(state, final)
        self.index()
        return summary
