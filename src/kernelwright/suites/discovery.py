"""Which problems a suite runs, and which candidate goes with each.

Problems: PROBLEMS arguments are files, folders or globs. A folder of problem files is used as
it is (KernelBench's `KernelBench/level1`); a folder holding `level*` folders (KernelBench's
`KernelBench/`) means all its levels. A problem's name is its file stem (`19_ReLU`), its key is
`level1/19_ReLU` inside a level folder; `--only`/`--skip` match a name, a key, a glob of either, a
level (`level2`), or a KernelBench problem id (`19`).

Candidates (suite eval), from CANDIDATES:
  - a folder: `<key>.py`, `<name>.py`, or KernelBench's `runs/` layout
    (`level_<L>_problem_<ID>_sample_<S>_kernel.py`, the lowest sample);
  - a JSON mapping file `{"<name or key>": "path/to/candidate.py"}` (paths relative to the file);
  - a JSON list or a JSONL file of `{"problem": "<name or key>", "code": "..."}` records
    (`"level"` and `"problem_id"` fields are understood too).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

from kernelwright.core import formats

LEVEL_DIR = re.compile(r"^level_?(\d+)$", re.I)
KB_SAMPLE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


class SuiteError(ValueError):
    """The suite cannot be set up. One line naming the fix."""


@dataclass(frozen=True)
class Problem:
    path: Path
    name: str  # file stem
    level: str | None  # "level1" when the file sits in a level folder

    @property
    def key(self) -> str:
        return f"{self.level}/{self.name}" if self.level else self.name

    @property
    def problem_id(self) -> str | None:
        m = re.match(r"^(\d+)_", self.name)
        return m.group(1) if m else None

    @property
    def level_number(self) -> str | None:
        m = LEVEL_DIR.match(self.level or "")
        return m.group(1) if m else None


def _level_of(path: Path) -> str | None:
    return path.parent.name if LEVEL_DIR.match(path.parent.name) else None


def _files_in(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if files:
        return files
    levels = sorted((p for p in folder.iterdir() if p.is_dir() and LEVEL_DIR.match(p.name)), key=lambda p: p.name)
    return [f for lv in levels for f in sorted(lv.glob("*.py")) if not f.name.startswith("_")]


def _sort_key(p: Problem) -> tuple:
    pid = p.problem_id
    return (p.level or "", int(pid) if pid else 1 << 30, p.name)


def matches(problem: Problem, pattern: str) -> bool:
    pattern = pattern.strip()
    if not pattern:
        return False
    if problem.level and (pattern == problem.level or pattern.lower() == f"level{problem.level_number}"):
        return True
    if problem.problem_id is not None and pattern == problem.problem_id:
        return True
    return fnmatch.fnmatchcase(problem.name, pattern) or fnmatch.fnmatchcase(problem.key, pattern)


def discover(paths: list[str], only: list[str] | None = None, skip: list[str] | None = None) -> list[Problem]:
    """The suite's problems, in level then KernelBench-id order. Raises SuiteError (one line)."""
    files: list[Path] = []
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            found = _files_in(p)
            if not found:
                raise SuiteError(
                    f"{arg} holds no problem files (*.py) nor level folders; pass KernelBench/level1 or a folder of problems"  # noqa: E501
                )
            files += found
        elif p.is_file():
            files.append(p)
        else:
            hits = sorted(Path(h) for h in glob.glob(arg, recursive=True))
            hits = [h for h in hits if h.is_file() and h.suffix == ".py"] + [
                f for h in hits if h.is_dir() for f in _files_in(h)
            ]
            if not hits:
                raise SuiteError(f"no problem files at {arg}; check the path or the glob")
            files += hits
    seen: dict[str, Problem] = {}
    for f in files:
        prob = Problem(path=f.resolve(), name=f.stem, level=_level_of(f.resolve()))
        if prob.key in seen and seen[prob.key].path != prob.path:
            raise SuiteError(
                f"two problems named {prob.key} ({seen[prob.key].path} and {prob.path}); pass one of them, or --skip one"  # noqa: E501
            )
        seen[prob.key] = prob
    problems = [
        p
        for p in seen.values()
        if (not only or any(matches(p, o) for o in only)) and not any(matches(p, s) for s in (skip or []))
    ]
    if not problems:
        raise SuiteError("no problems left after --only/--skip; check the names (a name, level1, an id, or a glob)")
    bad = []
    for problem in problems:
        try:
            formats.load_problem(problem.path)
        except (FileNotFoundError, formats.FormatError) as exc:
            bad.append(f"{problem.key} ({str(exc).splitlines()[0]})")
    if bad:
        raise SuiteError(
            f"not a KernelBench problem: {bad[0]}"
            + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
            + "; fix it or leave it out with --skip NAME"
        )
    return sorted(problems, key=_sort_key)


# ---- candidates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    text: str
    source: str  # where it came from (a path, or "FILE:line N")
    level: str | None = None  # the level folder it sits in ("level3"), when it sits in one


def _lookup(table: dict[str, Candidate], prob: Problem) -> Candidate | None:
    for k in (prob.key, prob.name):
        c = table.get(k)
        # a bare name never crosses levels: level3/1_task is not level1/1_task's candidate
        if c is not None and not (k != prob.key and c.level and prob.level and c.level != prob.level):
            return c
    if prob.problem_id is not None and prob.level_number is not None:
        return table.get(f"level_{prob.level_number}_problem_{prob.problem_id}")
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"cannot read candidate {path} ({exc}); check the file") from None


def _from_records(records: list, where: str) -> dict[str, Candidate]:
    table: dict[str, Candidate] = {}
    for n, rec in enumerate(records, 1):
        if not isinstance(rec, dict) or not isinstance(rec.get("code"), str):
            raise SuiteError(f'{where} record {n} is not {{"problem": ..., "code": ...}}; fix that record')
        keys = []
        if rec.get("problem") is not None:
            name = str(rec["problem"])
            keys.append(Path(name).stem if name.endswith(".py") else name)
        if rec.get("problem_id") is not None and rec.get("level") is not None:
            level = re.sub(r"\D", "", str(rec["level"]))
            keys.append(f"level_{level}_problem_{rec['problem_id']}")
        if not keys:
            raise SuiteError(f'{where} record {n} names no problem; add "problem" (or "level" and "problem_id")')
        for k in keys:
            table.setdefault(k, Candidate(rec["code"], f"{where}:{n}"))  # the first sample of a problem wins
    return table


def _from_folder(folder: Path) -> dict[str, Candidate]:
    table: dict[str, Candidate] = {}
    samples: dict[str, tuple[int, Path]] = {}
    stems: dict[str, list[Candidate]] = {}
    for f in sorted(folder.rglob("*.py")):
        m = KB_SAMPLE.match(f.name)
        if m:
            key, sample = f"level_{m.group(1)}_problem_{m.group(2)}", int(m.group(3))
            if key not in samples or sample < samples[key][0]:
                samples[key] = (sample, f)
            continue
        rel = f.relative_to(folder).with_suffix("").as_posix()
        level = f.parent.name if f.parent != folder and LEVEL_DIR.match(f.parent.name) else None
        cand = Candidate(_read(f), str(f), level)
        table.setdefault(rel, cand)
        stems.setdefault(f.stem, []).append(cand)
    for stem, cands in stems.items():
        for c in cands:  # runs/level3/1_task.py is level3/1_task's too
            if c.level:
                table.setdefault(f"{c.level}/{stem}", c)
        if len(cands) == 1:  # a name two files share (level1/1_task.py, level3/1_task.py) matches by key only
            table.setdefault(stem, cands[0])
    for key, (_, f) in samples.items():
        table[key] = Candidate(_read(f), str(f))
    return table


def load_candidates(source: str | Path) -> dict[str, Candidate]:
    """Every candidate CANDIDATES offers, keyed by the names it can be matched under."""
    path = Path(source)
    if path.is_dir():
        return _from_folder(path)
    if not path.is_file():
        raise SuiteError(f"candidates not found: {path}; pass a folder, a mapping file or a JSON/JSONL file")
    text = _read(path)
    if path.suffix == ".jsonl":
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    raise SuiteError(f"{path} line {n} is not JSON; fix that line") from None
        return _from_records(records, str(path))
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SuiteError(f"{path} is not JSON ({exc}); pass a JSON mapping, a JSON list or a .jsonl file") from None
    if isinstance(data, list):
        return _from_records(data, str(path))
    if isinstance(data, dict):
        table = {}
        for k, v in data.items():
            f = (path.parent / str(v)).resolve()
            if not f.is_file():
                raise SuiteError(f"{path} maps {k} to {v}, which is not a file; fix the mapping")
            table[k[:-3] if k.endswith(".py") else k] = Candidate(_read(f), str(f))
        return table
    raise SuiteError(f"{path} holds neither a mapping nor a list of records; see `kernelwright suite eval --help`")


def match(
    problems: list[Problem], table: dict[str, Candidate]
) -> tuple[list[tuple[Problem, Candidate]], list[Problem]]:
    """(problem, candidate) pairs, and the problems with no candidate."""
    pairs, missing = [], []
    for p in problems:
        c = _lookup(table, p)
        (pairs.append((p, c)) if c is not None else missing.append(p))
    return pairs, missing
