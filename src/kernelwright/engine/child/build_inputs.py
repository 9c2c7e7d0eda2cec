"""Every file a `load()` build reads, for its key: the sources and what they `#include`.

A key of the listed sources alone would let a header be baked into an entry keyed by an honest
source: two builds of the same `.cpp` beside different `kw.h` files must not share a binary. The
headers are the ones the compiler's preprocessor finds (`c++ -MM -MG`, with the build's include
folders and macros), so a header named through a macro or a search path counts too; the
toolchain's own (torch's, Python's, the system's, CUDA's: given as -isystem, which -MM leaves out)
are in the key's toolchain fingerprint instead. A header is named relative to its source's folder
where it lies below it (a candidate writes its sources to a temporary folder of its own, named
anew in each process), else by its absolute path.

Where the preprocessor cannot say (no compiler, an #error), the key gets a value of this process
alone: the build is never shared. Standard library and torch only (the child's rule).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

SCAN_TIMEOUT_S = 120.0
_KEPT_FLAGS = ("-D", "-U", "-I", "-isystem", "-include", "-std=")  # what changes which files are read


def _toolchain_dirs(with_cuda: bool) -> list[str]:
    import torch.utils.cpp_extension as cpp_ext

    dirs = list(cpp_ext.include_paths())
    dirs.append(sysconfig.get_paths()["include"])
    home = getattr(cpp_ext, "CUDA_HOME", None)
    if with_cuda and home:
        dirs.append(os.path.join(home, "include"))
    return [d for d in dirs if os.path.isdir(d)]


def _kept(flags: Any) -> list[str]:
    """The flags of `flags` (a list, or a string as torch also takes) that change what is included;
    a flag and its separate value (`-I dir`) stay together."""
    items = shlex.split(flags) if isinstance(flags, str) else [str(f) for f in flags or []]
    out: list[str] = []
    take_next = False
    for item in items:
        if take_next:
            out.append(item)
            take_next = False
        elif item.startswith(_KEPT_FLAGS):
            out.append(item)
            take_next = item in ("-D", "-U", "-I", "-isystem", "-include")
    return out


def _dependencies(make_rule: str) -> list[str]:
    """The prerequisites of a make rule as `-MM` writes it (escaped spaces kept)."""
    text = make_rule.replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    out, word = [], ""
    i = 0
    while i < len(deps):
        c = deps[i]
        if c == "\\" and i + 1 < len(deps) and deps[i + 1] == " ":
            word += " "
            i += 2
            continue
        if c.isspace():
            if word:
                out.append(word)
            word = ""
        else:
            word += c
        i += 1
    if word:
        out.append(word)
    return out


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "absent"


def included_files(source: str, kwargs: dict[str, Any], with_cuda: bool) -> list[list[str]] | str:
    """[name, sha256] of every file `source` includes (not the toolchain's), in the compiler's
    order; a string unique to this process where the preprocessor could not list them."""
    src = Path(source).resolve()
    cu = src.suffix in (".cu", ".cuh")
    flags = _kept(kwargs.get("extra_cflags")) + (_kept(kwargs.get("extra_cuda_cflags")) if cu else [])
    includes = [f"-I{d}" for d in kwargs.get("extra_include_paths") or []]
    system = [a for d in _toolchain_dirs(with_cuda or cu) for a in ("-isystem", d)]
    cxx = os.environ.get("CXX", "c++")
    argv = [cxx, "-MM", "-MG", "-x", "c++", "-std=c++17", *(["-D__CUDACC__"] if cu else []), *system, *includes]
    argv += [*flags, str(src)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=SCAN_TIMEOUT_S, cwd=src.parent)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unlisted ({type(exc).__name__}) {secrets.token_hex(8)}"
    if out.returncode != 0:
        return f"unlisted (exit {out.returncode}) {secrets.token_hex(8)}"
    files = []
    for dep in _dependencies(out.stdout)[1:]:  # the first is the source itself, hashed already
        path = Path(dep) if os.path.isabs(dep) else src.parent / dep
        try:
            name = str(path.resolve().relative_to(src.parent))
        except ValueError:
            name = str(path.resolve())
        files.append([name, _digest(path)])
    return files
