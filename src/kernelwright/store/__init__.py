"""Where runs are kept: the run directory (`rundir.py`), a folder of files a person can read, and
the run store (`db.py`), one SQLite file that indexes them (`indexer.py`) for suites, resumes and
reports. Notebooks: `from kernelwright.store import open_store` (`queries.py`)."""

from typing import Any

from kernelwright.store.queries import RunStore, default_store, open_store

__all__ = ["DEFAULT_STORE", "RunStore", "default_store", "open_store"]


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_STORE":  # the user's store, read when asked (KERNELWRIGHT_STORE may be set later)
        return default_store()
    raise AttributeError(name)
