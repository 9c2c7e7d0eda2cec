"""`kernelwright optimize --resume RUN`, and the store that indexes every optimize run."""

from __future__ import annotations

from pathlib import Path

from kernelwright.store.rundir import RunDir, RunDirError


def reopen(run: Path, problem: Path):
    """(run directory, its finished rounds); the problem must be the one the run was started on."""
    if not run.is_dir():
        raise RunDirError(f"--resume {run}: no such run directory; pass a directory written by `kernelwright optimize`")
    recorded = run / "problem.py"
    if recorded.is_file() and recorded.read_text() != problem.read_text():
        raise RunDirError(
            f"--resume {run}: that run optimised another problem ({recorded}); pass the same problem file"
        )
    return RunDir.reopen(run)


def indexed(run_dir: RunDir, store: Path | None):
    """The run directory as the loop's recorder, with the store indexing each round. A store that
    cannot be opened is said once on stderr; the run goes on with its files alone."""
    from rich.console import Console

    from kernelwright.store.db import Store, StoreError
    from kernelwright.store.queries import default_store
    from kernelwright.store.recorder import IndexingRecorder

    try:
        return IndexingRecorder(run_dir, Store.open(store or default_store()), kind="optimize")
    except StoreError as exc:
        Console(stderr=True).print(
            f"[yellow]warning:[/] {exc}; the run is recorded in its folder only", highlight=False
        )
        return run_dir
