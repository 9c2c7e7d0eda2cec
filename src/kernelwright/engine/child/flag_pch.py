"""Precompiled <torch/extension.h> for load_inline calls with their own C++ flags (and torch's
default flags where torch's own header cannot be made).

torch keeps one precompiled header per installation, for its default flags (`use_pch`, see
`build.pch_usable`), next to its header: the trusted builder's sandbox has torch's installation
read-only, so there the default flags (the empty set) get a header here too, by the same rule.
A candidate that passes `extra_cflags=["-O3", ...]`, as most hand-written and LLM-written C++
extensions do, gets none from torch: parsing <torch/extension.h> is about half of such a
build (24 s against 12 s for a one-function extension on a 2-core machine). Here each flag set
gets its own header, in a directory of its own that goes first on the include path:

    <cache>/builds/kw-pch/<key>/torch/extension.h.gch   what gcc loads where it is valid
    <cache>/builds/kw-pch/<key>/torch/extension.h       #include of torch's own header, the fallback

gcc looks for `torch/extension.h.gch` next to the header it is about to read and uses it only if
it was made with compatible options; otherwise it reads the fallback, so a header that does not
fit costs time, never correctness. load_inline's main.cpp starts with the include (before any C
token), as gcc requires.

The headers are build artefacts of the trusted cache: only the trusted builder makes them (it
alone writes `<cache>/builds`; the runner's sandbox has that directory read-only), and a build
reads them only there. A flag set gets a header at its second build (the first only records it): the header takes
about 1.5 builds to make, so a flag set seen once costs nothing more. One build makes it, under a
lock; a build that finds the lock taken goes on without it. At most `keep` headers are kept (each
is 0.8 GB with torch 2.13), the least recently used removed first.

Only flags of the simple shapes below (optimisation, machine, feature, macro and warning options)
are accepted; anything else (a plugin, a specs file, an include of a path) gets no header. The
trusted builder has checked the flags already (engine/extensions/static_builds.py); this is a second,
narrower gate for a file that every later build with those flags reads.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from kernelwright.engine.child.toolchain import tool_version

SIMPLE_FLAG = re.compile(
    r"-(?:O[0-3sgz]?|Ofast|f(?!plugin)[a-z0-9][\w+.=-]*|m[a-z0-9][\w+.=-]*|std=[\w+]+"
    r"|D[A-Za-z_]\w*(?:=[\w.+-]*)?|U[A-Za-z_]\w*|W[a-z][\w=+-]*|w|g[0-3]?|pthread)"
)
DEFAULT_KEEP = 3
SUBDIR = "kw-pch"  # in the build cache's root: never a build's own directory (those are NAME-KEY)
SEEN = "seen"  # a flag set's first build leaves this file; its second makes the header
FAILED = "failed"  # the header could not be made for this flag set (why): its builds go on without


def _torch_include() -> Path:
    import torch.utils.cpp_extension as cpp_ext

    return Path(cpp_ext._TORCH_PATH) / "include"


def _std_flag() -> str:
    """The -std= that torch's own PCH (and so its extension builds) use, read from torch's code."""
    import inspect

    import torch.utils.cpp_extension as cpp_ext

    try:
        src = inspect.getsource(cpp_ext._check_and_build_extension_h_precompiler_headers)
    except (AttributeError, OSError, TypeError):
        return "-std=c++17"
    found = re.search(r"-std=c\+\+\d+", src)
    return found.group(0) if found else "-std=c++17"


def accepted(kwargs: dict[str, Any], with_cuda: bool) -> list[str] | None:
    """The flags of a load_inline call that gets a header of its own, else None. A call with torch's
    default flags that does not get torch's own PCH (`use_pch` not set: torch's include directory is
    read-only, as in the trusted builder's sandbox) gets the empty flag set's header: `[]`."""
    flags = kwargs.get("extra_cflags")
    if with_cuda or "use_pch" in kwargs or kwargs.get("extra_include_paths"):
        return None  # a CUDA build's host pass is not checked yet; a call's own include paths may shadow torch's
    if flags is None or (isinstance(flags, (list, tuple)) and not flags):
        return []
    if not isinstance(flags, (list, tuple)) or not flags or len(flags) > 32:
        return None
    if not all(isinstance(f, str) and SIMPLE_FLAG.fullmatch(f) for f in flags):
        return None
    return list(flags)


def _command(flags: list[str], out: Path) -> list[str]:
    import torch.utils.cpp_extension as cpp_ext

    inc = _torch_include()
    return [
        cpp_ext.get_cxx_compiler(),
        "-x",
        "c++-header",
        str(inc / "torch" / "extension.h"),
        "-o",
        str(out),
        "-I",
        str(inc),
        "-I",
        sysconfig.get_path("include"),
        "-I",
        str(inc / "torch" / "csrc" / "api" / "include"),
        *flags,
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        _std_flag(),
        "-fPIC",
    ]


def _key(flags: list[str]) -> str:
    import torch

    blob = "\n".join([torch.__version__, tool_version(os.environ.get("CXX", "c++")), *_command(flags, Path("-"))])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def header_dir(flags: list[str], keep: int, root: Path) -> Path | None:
    """The include directory with this flag set's header under `root`: made here at the flag
    set's second build; None where there is none (yet) or it cannot be made (not gcc, not Linux)."""
    import sys

    import torch.utils.cpp_extension as cpp_ext

    try:
        if not sys.platform.startswith("linux") or not cpp_ext.check_compiler_is_gcc(cpp_ext.get_cxx_compiler()):
            return None
        key = _key(flags)
        here = root / key
        pch = here / "torch" / "extension.h.gch"
        if pch.exists():
            os.utime(here)  # recently used
            return here
        here.mkdir(parents=True, exist_ok=True)
        if not (here / SEEN).exists():
            (here / SEEN).write_text(" ".join(flags))
            return None
        if (here / FAILED).exists():
            return None  # the compiler would not make one for these flags: not tried at every build
        with open(here / "lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another build is making it: this one goes on without
            if not pch.exists():
                try:
                    _make(flags, here)
                except (OSError, subprocess.SubprocessError) as exc:
                    (here / FAILED).write_text(f"{type(exc).__name__}: {exc}"[:2000])
                    return None
        _forget_old(root, keep)
        return here if pch.exists() else None
    except (OSError, subprocess.SubprocessError, ImportError):
        return None


def _make(flags: list[str], here: Path) -> None:
    (here / "torch").mkdir(exist_ok=True)
    fallback = here / "torch" / "extension.h"
    fallback.write_text(f'#include "{_torch_include() / "torch" / "extension.h"}"\n')
    tmp = here / "torch" / f"extension.h.gch.{os.getpid()}"
    try:
        subprocess.run(_command(flags, tmp), check=True, capture_output=True, timeout=600)
        os.replace(tmp, here / "torch" / "extension.h.gch")
    finally:
        tmp.unlink(missing_ok=True)


def _forget_old(root: Path, keep: int) -> None:
    made = [d for d in root.iterdir() if (d / "torch" / "extension.h.gch").exists()]
    made.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for d in made[keep:]:
        (d / "torch" / "extension.h.gch").unlink(missing_ok=True)  # a build reading it keeps its open copy
