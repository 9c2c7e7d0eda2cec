"""Where runs are kept: the run directory (`rundir.py`), a folder of files a person can read, and
the run store (`db.py`), one SQLite file that indexes them (`indexer.py`) for suites, resumes and
reports. Notebooks: `from kernelwright.store import open_store` (`api.py`)."""

from kernelwright.store.api import DEFAULT_STORE, RunStore, open_store

__all__ = ["DEFAULT_STORE", "RunStore", "open_store"]
