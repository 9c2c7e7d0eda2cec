"""KernelBench problems by level and id (`level1/19`), as KernelBench's users name them.

    kernelwright eval level1/19 my_relu.py --kernelbench ~/KernelBench          # a local checkout
    kernelwright optimize level2/5 --kernelbench ScalingIntelligence/KernelBench  # the Hugging Face dataset

`--kernelbench` is a local checkout (its root, or the `KernelBench/` folder that holds `level1/`,
...), a data file (`.json`, `.jsonl`, `.parquet`, `.csv` with KernelBench's columns `code`,
`level`, `problem_id`, `name`), or a dataset name on the Hugging Face hub (split `level_<L>`).
Data files and the hub go through the `datasets` package (`pip install datasets`). A problem read
from a dataset is written once, as `<id>_<name>.py`, beside the run store (`kernelbench/`), so a
run and its resume see the same file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PROBLEM_ID = re.compile(r"^level_?(\d+)/(\d+)$", re.I)
DATA_FILES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


class KernelBenchError(ValueError):
    """A KernelBench problem that cannot be found. One line naming the fix."""


def parse_id(text: str) -> tuple[int, int] | None:
    """(level, problem id) of `level1/19` (or `level_1/19`); None for anything else."""
    m = PROBLEM_ID.match(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def resolve(problem: str, source: str, cache: Path) -> Path:
    """The problem file of `problem` (`level1/19`) in `source` (a checkout, a data file, a hub dataset)."""
    ids = parse_id(problem)
    if ids is None:
        raise KernelBenchError(f"--kernelbench takes a problem as level/id (e.g. level1/19), not {problem!r}")
    level, pid = ids
    src = Path(source).expanduser()
    if src.is_dir():
        return _from_checkout(src, level, pid, source)
    rows = _dataset_rows(src if src.is_file() else None, source, level)
    for row in rows:
        if _int(row.get("problem_id")) == pid and _int(row.get("level"), level) == level:
            return _write(row, level, pid, source, cache)
    raise KernelBenchError(f"--kernelbench {source}: no problem {pid} in level {level}; check the id")


def _from_checkout(root: Path, level: int, pid: int, source: str) -> Path:
    for folder in (root / f"level{level}", root / "KernelBench" / f"level{level}"):
        if folder.is_dir():
            found = sorted(p for p in folder.glob(f"{pid}_*.py"))
            if found:
                return found[0]
            raise KernelBenchError(f"--kernelbench {source}: no problem {pid} in {folder}; check the id")
    raise KernelBenchError(
        f"--kernelbench {source}: no level{level}/ folder there; pass a KernelBench checkout "
        "(the repository, or its KernelBench/ folder)"
    )


def _dataset_rows(data_file: Path | None, source: str, level: int) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise KernelBenchError(
            f"--kernelbench {source}: reading a dataset needs the datasets package; "
            "pip install datasets, or pass a local KernelBench checkout"
        ) from None
    try:
        if data_file is not None:
            kind = DATA_FILES.get(data_file.suffix.lower())
            if kind is None:
                raise KernelBenchError(
                    f"--kernelbench {source}: not a folder nor a data file "
                    f"({', '.join(DATA_FILES)}); pass a KernelBench checkout or dataset"
                )
            table = datasets.load_dataset(kind, data_files=str(data_file), split="train")
        else:
            table = datasets.load_dataset(source, split=f"level_{level}")
    except KernelBenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - the hub, the network, a malformed file: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KernelBenchError(
            f"--kernelbench {source}: cannot read the dataset ({first}); check the name or path"
        ) from None
    missing = {"code", "problem_id"} - set(table.column_names)
    if missing:
        raise KernelBenchError(
            f"--kernelbench {source}: the dataset has no {', '.join(sorted(missing))} column; "
            "pass KernelBench's dataset (columns code, level, problem_id, name)"
        )
    return [dict(r) for r in table]


def _int(value: Any, default: int | None = None) -> int | None:
    if value is None:
        return default
    digits = re.sub(r"\D", "", str(value))
    return int(digits) if digits else default


def _write(row: dict[str, Any], level: int, pid: int, source: str, cache: Path) -> Path:
    from kernelwright.store.files import write_public

    name = Path(str(row.get("name") or "")).stem
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "problem"
    if not name.startswith(f"{pid}_"):
        name = f"{pid}_{name}"
    where = re.sub(r"[^A-Za-z0-9_.-]+", "_", source).strip("._") or "dataset"
    path = cache / where / f"level{level}" / f"{name}.py"
    code = str(row["code"])
    if not path.is_file() or path.read_text() != code:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_public(path, code)
    return path
