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
    recursion depth mismatch" (two evaluations of a suite started together hit it)."""
    with _AST_LOCK:
        return ast.parse(text, filename=filename)


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
