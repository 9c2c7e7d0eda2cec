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
_BENCHMARK_MODULE = "torch.utils.benchmark"


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for a chain of names, "" for anything else (iterative: a chain of any length)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def clocks_read(text: str) -> list[str]:
    """The clocks a candidate's source reads (`torch.cuda.Event.elapsed_time`, `time.perf_counter`,
    `triton.testing.do_bench`, `torch.utils.benchmark.Timer`), sorted; [] where it reads none or does not
    parse. From the syntax tree, so a comment or a string that names a clock is not a read; a clock taken
    by name and called later (`clock = time.perf_counter`) is. A candidate that times itself can pick its
    path by what it reads, so its path, speed and error follow the load of the process it runs in (the
    `self_timed` flag). Its own word, like any source: a report, no verdict."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):  # (ValueError: a NUL byte in the text)
        return []
    time_modules = {"time"}  # names the time module goes by (`import time as t`)
    bench_modules: set[str] = set()  # names torch.utils.benchmark goes by
    imported: dict[str, str] = {}  # a name bound by `from M import X as name` -> the clock it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "time":
                    time_modules.add(a.asname or "time")
                elif a.name == _BENCHMARK_MODULE and a.asname:
                    bench_modules.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if node.module == "time" and a.name in _TIME_READS:
                    imported[a.asname or a.name] = f"time.{a.name}"
                elif node.module == "torch.utils" and a.name == "benchmark":
                    bench_modules.add(a.asname or a.name)
                elif node.module == _BENCHMARK_MODULE and a.name == "Timer":
                    imported[a.asname or a.name] = f"{_BENCHMARK_MODULE}.Timer"
                elif node.module == "triton.testing" and a.name == "do_bench":
                    imported[a.asname or a.name] = "triton.testing.do_bench"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):  # (`self.elapsed_time = 0` is no read)
            owner = _dotted(node.value)
            if node.attr == "elapsed_time":
                found.add("torch.cuda.Event.elapsed_time")
            elif node.attr == "do_bench":
                found.add("triton.testing.do_bench")
            elif node.attr in _TIME_READS and owner in time_modules:
                found.add(f"time.{node.attr}")
            elif node.attr == "Timer" and (owner in bench_modules or owner == _BENCHMARK_MODULE):
                found.add(f"{_BENCHMARK_MODULE}.Timer")
        elif isinstance(node, ast.Name) and node.id in imported and isinstance(node.ctx, ast.Load):
            found.add(imported[node.id])
    return sorted(found)
