"""Problem and candidate formats (KernelBench): read and checked statically, never executed here.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`.
A candidate file defines `class ModelNew(nn.Module)` with the same constructor and forward.
Both are only parsed in the caller's process; they run in the evaluation child.
"""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass
from pathlib import Path


class FormatError(ValueError):
    """A file that is not in the expected format. The message is one line that names the fix."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str


def _top_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


_AST_LOCK = threading.Lock()


def parse_python(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one thread at a time: CPython 3.11's parser keeps its recursion depth in
    process-wide state, and two threads parsing at once fail with "SystemError: AST constructor
    recursion depth mismatch" (two evaluations of a suite started together hit it). A text nested
    too deeply for the parser (200,000 unary minuses: MemoryError, or RecursionError) is a
    SyntaxError like any other, so every reader of a candidate turns it away as one."""
    with _AST_LOCK:
        try:
            return ast.parse(text, filename=filename)
        except (MemoryError, RecursionError):
            raise SyntaxError("nested too deeply to parse", (filename, 1, 0, "")) from None


def _parse(text: str, path: Path, what: str) -> ast.Module:
    try:
        return parse_python(text, filename=str(path))
    except SyntaxError as exc:
        raise FormatError(f"{what} {path} is not valid Python (line {exc.lineno}: {exc.msg}); fix the syntax") from None


def _read(path: str | Path, what: str) -> SourceFile:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} file not found: {p}; check the path")
    if not p.is_file():
        raise FileNotFoundError(f"{what} path is not a file: {p}; pass a .py file")
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise FormatError(f"{what} {p} is not UTF-8 text; pass a Python source file") from None
    return SourceFile(path=p.resolve(), text=text)


def load_problem(path: str | Path) -> SourceFile:
    """Read a KernelBench problem and check that it defines what the engine needs."""
    src = _read(path, "problem")
    names = _top_level_names(_parse(src.text, src.path, "problem"))
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise FormatError(
            f"problem {src.path} defines no {', '.join(missing)}; "
            "a KernelBench problem needs class Model, get_inputs() and get_init_inputs()"
        )
    return src


def check_candidate_text(text: str, path: Path | str = "<candidate>") -> None:
    """Raise FormatError when a candidate's text cannot be a ModelNew module."""
    tree = _parse(text, Path(path), "candidate")
    names = _top_level_names(tree)
    if "ModelNew" not in names:
        raise FormatError(f"candidate {path} defines no class ModelNew; define class ModelNew(nn.Module)")


_FIRST_CALL_JIT = re.compile(
    r"^\s*(?:import\s+triton|from\s+triton\b)|\btorch\.compile\b|@\s*triton\.(?:jit|autotune)\b", re.MULTILINE
)


_IN_PROCESS_JIT = re.compile(r"\btorch\.compile\b|\btorch\._dynamo\b")


def compiles_out_of_sight(text: str) -> bool:
    """Whether a candidate compiles at its first call in its own process, where no compiler process
    or cache file shows it (torch.compile's tracing): its JIT allowance is granted whole."""
    return bool(_IN_PROCESS_JIT.search(text))


def compiles_at_first_call(text: str) -> bool:
    """Whether a candidate's source compiles kernels at its first call (Triton's JIT and autotuning,
    torch.compile): such a candidate's correctness stage gets the JIT allowance on top of its limit."""
    return bool(_FIRST_CALL_JIT.search(text))


# The clocks a candidate may read in its own code, as the names a reader knows them by.
_TIME_READS = ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns", "process_time")
_BENCH_CALLS = {"do_bench": "triton.testing.do_bench", "Timer": "torch.utils.benchmark.Timer"}


def clocks_read(text: str) -> list[str]:
    """The clocks a candidate's source reads (`torch.cuda.Event.elapsed_time`, `time.perf_counter`,
    `triton.testing.do_bench`, ...), sorted; [] where it reads none or does not parse. Calls only, from
    the syntax tree: a comment or a string that names a clock is not a read. A candidate that times
    itself can pick its path by what it reads, so its path, speed and error follow the load of the
    process it runs in (the `self_timed` flag). Its own word, like any source: a report, no verdict."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):  # (ValueError: a NUL byte in the text)
        return []
    time_modules = {"time"}  # names the time module goes by (`import time as t`)
    time_names: dict[str, str] = {}  # `from time import perf_counter as pc`: pc -> perf_counter
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            time_modules |= {a.asname or a.name for a in node.names if a.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            time_names |= {a.asname or a.name: a.name for a in node.names if a.name in _TIME_READS}
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr == "elapsed_time":
                found.add("torch.cuda.Event.elapsed_time")
            elif func.attr in _TIME_READS and isinstance(func.value, ast.Name) and func.value.id in time_modules:
                found.add(f"time.{func.attr}")
            elif func.attr in _BENCH_CALLS:
                found.add(_BENCH_CALLS[func.attr])
        elif isinstance(func, ast.Name):
            if func.id in time_names:
                found.add(f"time.{time_names[func.id]}")
            elif func.id == "do_bench":
                found.add(_BENCH_CALLS["do_bench"])
    return sorted(found)
