"""A compiler's output read as a person needs it: the first errors, each located in the file the
build generated and in the candidate's file, at the line where the kernel's source string sits.
Standard library and `core` only."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from kernelwright.core.formats import parse_python
from kernelwright.core.record import CompileIssue

MAX_ISSUES = 10

# nvcc:  /path/cuda.cu(12): error: identifier "foo" is undefined
# gcc:   /path/main.cpp:12:5: error: 'foo' was not declared in this scope
_NVCC_RE = re.compile(
    r"^(?P<file>[^\s:()][^:()]*?\.(?:cu|cuh|cpp|cc|cxx|h|hpp))\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error)[^:]*: (?P<msg>.*)$"  # noqa: E501
)
_GCC_RE = re.compile(
    r"^(?P<file>[^\s:][^:]*?\.(?:cu|cuh|cpp|cc|cxx|h|hpp)):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning): (?P<msg>.*)$"  # noqa: E501
)
_PTXAS_RE = re.compile(r"^(?P<msg>ptxas (?:fatal|error)\s*:.*)$")
_LINK_RE = re.compile(r"^(?P<msg>.*(?:undefined reference to|undefined symbol).*)$")


def parse_compiler_output(text: str, candidate_file: str | None) -> list[CompileIssue]:
    """The first errors of a build log, each located in the generated file and in the candidate."""
    issues: list[CompileIssue] = []
    seen: set[tuple[str | int, ...]] = set()
    locator = _CandidateLocator(candidate_file)
    for raw in text.splitlines():
        line = raw.strip()
        m = _NVCC_RE.match(line) or _GCC_RE.match(line)
        if m:
            sev = "warning" if m.group("sev") == "warning" else "error"
            if sev == "warning":
                continue
            file = m.group("file")
            lineno = int(m.group("line"))
            col = int(m.group("col")) if "col" in m.groupdict() and m.group("col") else None
            key = (file, lineno, m.group("msg"))
            if key in seen:
                continue
            seen.add(key)
            src_line = _line_of(file, lineno)
            issues.append(
                CompileIssue(
                    message=m.group("msg").strip(),
                    file=os.path.basename(file),
                    line=lineno,
                    column=col,
                    candidate_line=locator.locate(file, lineno),
                    source_line=src_line,
                )
            )
        else:
            m = _PTXAS_RE.match(line) or _LINK_RE.match(line)
            if m and (m.group("msg"),) not in seen:
                seen.add((m.group("msg"),))
                issues.append(CompileIssue(message=m.group("msg").strip()))
        if len(issues) >= MAX_ISSUES:
            break
    if not issues and "Error building extension" in text:
        tail = [l for l in text.splitlines() if l.strip()][-3:]
        issues.append(CompileIssue(message=" | ".join(t.strip() for t in tail)[:500]))
    return issues


def _line_of(file: str, lineno: int) -> str | None:
    try:
        lines = Path(file).read_text(errors="replace").splitlines()
        return lines[lineno - 1].rstrip() if 0 < lineno <= len(lines) else None
    except OSError:
        return None


class _CandidateLocator:
    """Maps a line of a generated source file back to the candidate's line.

    The generated file (main.cpp, cuda.cu) is the candidate's source string with a few lines
    around it. We find which string constant of the candidate file appears in the generated
    file, and where, then offset by the constant's own line in the candidate.
    """

    def __init__(self, candidate_file: str | None):
        self.constants: list[tuple[int, str]] = []  # (line in candidate where the text starts, text)
        if not candidate_file:
            return
        try:
            tree = parse_python(Path(candidate_file).read_text())
        except (OSError, SyntaxError):
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
                self.constants.append((node.lineno, node.value))

    def locate(self, generated_file: str, gen_line: int) -> int | None:
        try:
            generated = Path(generated_file).read_text(errors="replace")
        except OSError:
            return None
        for const_line, text in self.constants:
            idx = generated.find(text)
            if idx < 0:
                continue
            start_line = generated.count("\n", 0, idx) + 1  # generated line of the text's first line
            n_lines = text.count("\n") + 1
            if start_line <= gen_line < start_line + n_lines:
                return const_line + (gen_line - start_line)
        return None


def certain_failure(issues: list[CompileIssue]) -> bool:
    """Does a failed lean build say that the build as written fails too? Yes when an error is in
    main.cpp: the lean build changes only the CUDA sources' headers, and its main.cpp (the
    cpp_sources after an explicit <torch/extension.h>, with the same flags) is the file torch
    writes for the build as written (the same sources after its implicit <torch/extension.h>)."""
    return any(i.file == "main.cpp" for i in issues)
