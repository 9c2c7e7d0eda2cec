"""Building a candidate's extensions: a content-addressed build cache and readable compiler errors.

`install_build_cache` wraps `torch.utils.cpp_extension.load_inline` (and `load`) before the
candidate is imported. Each call gets its own build directory named by its extension's name and a
hash of everything that decides the binary: the sources, the flags and the toolchain. So two
candidates that both say `load_inline(name="my_ext", ...)` with different code never load each
other's module, and an unchanged extension is not rebuilt.

A build failure becomes `CandidateBuildError` carrying the compiler's full output and the first
errors located both in the generated file and in the candidate file, at the line where the
kernel source string sits.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sys
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from kernelwright.core.formats import parse_python
from kernelwright.core.record import CompileIssue
from kernelwright.engine.child import build_inputs, flag_pch
from kernelwright.engine.child.build_precheck import _as_list, _Sources, module_defined_twice, undeclared_functions
from kernelwright.engine.child.compiler_output import certain_failure, parse_compiler_output
from kernelwright.engine.child.toolchain import tool_version

if TYPE_CHECKING:
    from kernelwright.engine.child.lean_headers import LeanSources


class CandidateBuildError(RuntimeError):
    """An extension of the candidate failed to build."""

    def __init__(self, name: str, output: str, issues: list[CompileIssue]):
        self.name = name
        self.output = output
        self.issues = issues
        first = issues[0].message if issues else "see the compiler output"
        super().__init__(f"Error building extension '{name}': {first}")


# Every build the wrapper saw in this process, in order; kept here too so that a candidate
# that catches CandidateBuildError still gets a compile_error verdict.
BUILD_LOG: list[dict[str, Any]] = []
# (extension name, loaded module) of every successful build: the profiler labels their functions.
BUILT_MODULES: list[tuple[str, Any]] = []


def pch_usable(kwargs: dict[str, Any]) -> bool:
    """Whether a load_inline call gets torch's precompiled <torch/extension.h> (`use_pch=True`).

    Only for calls with torch's default C++ flags (no extra_cflags / include paths): a PCH is valid
    for one flag set and torch keeps one per installation, so one shared flag set means it is built
    once per machine and never thrashed by candidates with their own flags. Needs Linux, GCC and a
    writable torch include directory (torch writes the .gch next to the header).
    """
    if "use_pch" in kwargs or kwargs.get("extra_cflags") or kwargs.get("extra_include_paths"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        import torch.utils.cpp_extension as cpp_ext

        if not hasattr(cpp_ext, "_check_and_build_extension_h_precompiler_headers"):
            return False
        if not cpp_ext.check_compiler_is_gcc(cpp_ext.get_cxx_compiler()):
            return False
        inc = os.path.join(cpp_ext._TORCH_PATH, "include", "torch")
        return os.access(inc, os.W_OK)
    except Exception:
        return False


def _prepare_pch(lock_path: Path | None = None) -> bool:
    """Build (or find) torch's PCH under a lock, so concurrent builds never read a half-written one.

    The lock sits next to the PCH (torch's include directory), so every cache shares it.
    """
    import fcntl

    import torch.utils.cpp_extension as cpp_ext

    lock_path = lock_path or Path(cpp_ext._TORCH_PATH) / "include" / "torch" / "extension.h.kw-lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            cpp_ext._check_and_build_extension_h_precompiler_headers(None, None)
            return True
        except Exception:
            return False
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@functools.cache
def toolchain_fingerprint(with_cuda: bool) -> dict[str, str]:
    import torch

    fp = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "cxx": tool_version(os.environ.get("CXX", "c++")),
        "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
    }
    if with_cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else "nvcc"
        fp["nvcc"] = tool_version(nvcc)
    return fp


def build_key(kind: str, payload: dict[str, Any], with_cuda: bool) -> str:
    """The call's key: what decides the binary except the extension's name, which only names the
    module (its directory is `{name}-{key}`). Calls alike but for a name made per process
    (`f"ext_{id(self)}"`) share a key, so one trusted build serves them all (see `_same_build`)."""
    blob = json.dumps(
        {"kind": kind, "payload": payload, "toolchain": toolchain_fingerprint(with_cuda)},
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _tolerate_read_only_torch(cpp_ext: Any) -> None:
    """load_inline deletes a stale torch/extension.h.gch from torch's install; in the read-only
    sandbox that raises EROFS. Skipping the deletion is safe: gcc ignores a PCH that does not match.
    `cpp_ext`: torch.utils.cpp_extension (typed Any, as all of torch is here)."""
    original = getattr(cpp_ext, "remove_extension_h_precompiler_headers", None)
    if original is None or getattr(original, "_kw_tolerant", False):
        return

    def remove_extension_h_precompiler_headers() -> None:
        try:
            original()
        except OSError:
            pass

    vars(remove_extension_h_precompiler_headers)["_kw_tolerant"] = True
    cpp_ext.remove_extension_h_precompiler_headers = remove_extension_h_precompiler_headers


class _BuildRoutes:
    """The routes of one `install_build_cache`: each load_inline/load call to its build directory
    (its settings are that function's arguments)."""

    def __init__(
        self,
        root: Path,
        candidate_file: str | None,
        use_pch: bool,
        lean_headers: bool,
        verified: dict[str, str] | None,
        private_root: str | os.PathLike[str] | None,
        publish: bool,
        failed: dict[str, str] | None,
        flag_pch_keep: int,
        original_inline: Callable[..., Any],
        original_load: Callable[..., Any],
    ) -> None:
        self.root, self.candidate_file, self.use_pch, self.lean_headers = root, candidate_file, use_pch, lean_headers
        self.verified, self.private_root, self.publish, self.failed = verified, private_root, publish, failed
        self.flag_pch_keep, self.original_inline, self.original_load = flag_pch_keep, original_inline, original_load

    def run(
        self,
        kind: str,
        name: str,
        build_dir: Path,
        call: Callable[[Path], types.ModuleType],
        key: str,
        extra: dict[str, Any] | None = None,
        tentative: bool = False,
    ) -> types.ModuleType | None:
        """`call(directory)` builds and loads; `build_dir` is the call's directory in the shared cache."""
        entry: dict[str, Any] = {"kind": kind, "name": name, "key": key, "dir": str(build_dir), **(extra or {})}
        BUILD_LOG.append(entry)
        t0 = time.perf_counter()
        failed_as = _same_build(self.failed or {}, build_dir.name, key) if self.private_root is not None else None
        if failed_as is not None:
            output = (self.failed or {})[failed_as]
            entry["cache"] = "failed in the trusted build"

            def replay(_directory: Path, output: str = output) -> NoReturn:  # the builder's output, as if built here
                raise RuntimeError(output)

            call = replay
        elif self.private_root is not None:
            built_as = _same_build(self.verified or {}, build_dir.name, key)
            if built_as is not None:
                built_name = built_as[: -len(key) - 1]
                if built_name != name:  # the same call under a name of this process's own
                    entry["built_as"] = built_name
                expected = (self.verified or {})[built_as]
                module = _load_verified(built_name, self.root / built_as, expected, Path(self.private_root), entry)
                if module is not None:
                    entry.update(ok=True, cached=True, build_s=time.perf_counter() - t0, functions=_functions(module))
                    BUILT_MODULES.append((name, module))
                    return module
            else:
                entry["cache"] = "private"
            build_dir = Path(self.private_root) / build_dir.name
            build_dir.mkdir(parents=True, exist_ok=True)
            entry["dir"] = str(build_dir)
        # one builder at a time per directory (trusted: clear, build and record as one step); a call
        # that failed in the trusted builder builds nothing (its output is replayed), so takes no lock
        lock = None if entry.get("cache") == "failed in the trusted build" else _hold_build_dir(build_dir)
        if self.publish:
            _clear_unrecorded(build_dir, name)
        entry["cached"] = any(build_dir.glob(f"{name}*.so")) or any(build_dir.glob(f"{name}*.pyd"))
        try:
            return self.build_and_load(entry, name, build_dir, call, tentative, t0)
        finally:
            if lock is not None:
                lock.close()

    def build_and_load(
        self,
        entry: dict[str, Any],
        name: str,
        build_dir: Path,
        call: Callable[[Path], types.ModuleType],
        tentative: bool,
        t0: float,
    ) -> types.ModuleType | None:
        try:
            module = call(build_dir)
        except Exception as exc:
            # One rule for every way the candidate's build fails (docs/VERDICTS.md, "Builds the
            # candidate catches"): the compiler's error, a link error found when the module is
            # imported (an undefined symbol), or a call torch rejects. Each is recorded as a failed
            # build, so a candidate that catches it and falls back to PyTorch is still a
            # compile_error. What the machine lacks (no CUDA toolkit: OSError; no ninja) is not the
            # candidate's build failing: it goes on as raised (the verdict says what is missing).
            text = str(exc)
            compiler = isinstance(exc, RuntimeError) and "Error building extension" in text
            candidate_fault = compiler or isinstance(exc, (ImportError, TypeError))
            if tentative and (candidate_fault or not isinstance(exc, OSError)):
                BUILD_LOG.remove(entry)  # a lean build that failed: the build as written follows
                raise _LeanBuildFailed(text, time.perf_counter() - t0) from None
            if not candidate_fault:
                entry["ok"] = False
                raise
            if not compiler:
                text = load_failure_text(name, exc)
            issues = parse_compiler_output(text, self.candidate_file)
            entry.update(ok=False, output=text, issues=[asdict(i) for i in issues])
            raise CandidateBuildError(name, text, issues) from None
        entry["ok"] = True
        entry["build_s"] = time.perf_counter() - t0
        if self.publish:
            entry["sha256"] = _record_artefact(build_dir, name)
            return None
        entry["functions"] = _functions(module)
        BUILT_MODULES.append((name, module))
        return module

    def load_inline(
        self, name: str, cpp_sources: _Sources, cuda_sources: _Sources = None, *args: Any, **kwargs: Any
    ) -> types.ModuleType | None:
        args, kwargs = _as_keywords(self.original_inline, args, kwargs)  # one key however the call was written
        _precheck_functions(self.original_inline, name, cpp_sources, cuda_sources, args, kwargs, self.candidate_file)
        with_cuda = bool(cuda_sources) or bool(kwargs.get("with_cuda"))
        # the key is the call's own, taken before the PCH is added: whether torch's PCH can be used
        # (a writable torch install) belongs to the process, and the trusted builder and the
        # sandboxed runner must key the same call the same way
        payload = {
            "cpp": cpp_sources,
            "cuda": cuda_sources,
            "args": args,
            "kwargs": {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")},
        }
        key = build_key("inline", payload, with_cuda)
        pch = self.use_pch and pch_usable(kwargs) and _prepare_pch()
        if pch:
            kwargs["use_pch"] = True
        extra: dict[str, Any] = {"pch": pch}
        lean = _lean_plan(cuda_sources, kwargs, args, self.original_inline) if self.lean_headers else None
        if lean is not None:
            lean_payload = dict(payload, cuda=lean.cuda_sources, lean=True)
            lean_key = build_key("inline", lean_payload, with_cuda)
            lean_dir = self.root / f"{name}-{lean_key}"
            failed_marker = lean_dir / LEAN_FAILED
            if failed_marker.exists():  # this source needs more than the lean headers: known already
                extra["lean_headers"] = {
                    "used": False,
                    "reason": "the lean build failed in an earlier lean build of this source; built as written",
                }
            else:
                if self.private_root is None:
                    lean_dir.mkdir(parents=True, exist_ok=True)
                lean_kwargs = dict(kwargs, no_implicit_headers=True)
                # no_implicit_headers drops main.cpp's <torch/extension.h> too: the bindings need it
                lean_cpp = ["#include <torch/extension.h>"] + _as_list(cpp_sources)
                try:
                    return self.run(
                        "inline",
                        name,
                        lean_dir,
                        lambda d: self.original_inline(
                            name, lean_cpp, lean.cuda_sources, *args, **dict(lean_kwargs, build_directory=str(d))
                        ),
                        lean_key,
                        dict(extra, lean_headers={"used": True, "op_headers": lean.op_headers}),
                        tentative=True,
                    )
                except _LeanBuildFailed as failure:
                    found = parse_compiler_output(failure.output, None)
                    first = next((i.message for i in found), "")
                    if self.private_root is None:  # an evaluation never writes the shared cache
                        failed_marker.write_text(failure.output[-20000:])
                    if certain_failure(found):
                        _fail_as_written(name, self.root / f"{name}-{key}", key, failure, self.candidate_file)
                    extra["lean_headers"] = {
                        "used": False,
                        "tried_s": round(failure.seconds, 2),
                        "reason": f"the lean build failed ({first[:200]}); built as written",
                    }
        build_dir = self.root / f"{name}-{key}"
        if self.private_root is None:
            build_dir.mkdir(parents=True, exist_ok=True)
        own_header = self.use_pch and self.flag_pch_keep > 0 and self.publish
        flags = flag_pch.accepted(kwargs, with_cuda) if own_header else None
        # a compile to come, with the call's own flags (or torch's, where its own header cannot be made here)
        if flags is not None and not any(build_dir.glob(f"{name}*.so")):
            here = flag_pch.header_dir(flags, self.flag_pch_keep, self.root / flag_pch.SUBDIR)  # a header of its own
            if here is not None:
                kwargs["extra_include_paths"] = [str(here)]
                extra["pch"] = "flags"
        return self.run(
            "inline",
            name,
            build_dir,
            lambda d: self.original_inline(
                name, cpp_sources, cuda_sources, *args, **dict(kwargs, build_directory=str(d))
            ),
            key,
            extra,
        )

    def load(self, name: str, sources: str | Iterable[str], *args: Any, **kwargs: Any) -> types.ModuleType | None:
        args, kwargs = _as_keywords(self.original_load, args, kwargs, after=2)  # as the trusted builder calls it
        srcs = [sources] if isinstance(sources, str) else list(sources)
        contents = []  # each file's name too: the same text in a .cpp and in a .cu builds differently
        for s in srcs:
            try:
                contents.append([os.path.basename(str(s)), Path(s).read_text()])
            except OSError:
                contents.append([os.path.basename(str(s)), f"<unreadable {s}>"])
        with_cuda = any(str(s).endswith(".cu") for s in srcs) or bool(kwargs.get("with_cuda"))
        payload = {
            "sources": contents,
            # and every file they include: a header that changes changes the key (build_inputs.py)
            "includes": [build_inputs.included_files(str(s), kwargs, with_cuda) for s in srcs],
            "args": args,
            "kwargs": {k: v for k, v in kwargs.items() if k not in ("verbose", "build_directory")},
        }
        key = build_key("load", payload, with_cuda)
        build_dir = self.root / f"{name}-{key}"
        if self.private_root is None:
            build_dir.mkdir(parents=True, exist_ok=True)
        return self.run(
            "load",
            name,
            build_dir,
            lambda d: self.original_load(name, sources, *args, **dict(kwargs, build_directory=str(d))),
            key,
        )


def install_build_cache(
    cache_root: str | os.PathLike[str],
    candidate_file: str | None,
    use_pch: bool = False,
    lean_headers: bool = False,
    *,
    verified: dict[str, str] | None = None,
    private_root: str | os.PathLike[str] | None = None,
    publish: bool = False,
    failed: dict[str, str] | None = None,
    flag_pch_keep: int = 0,
) -> None:
    """Route every load_inline/load call to a build directory keyed by content.

    With `use_pch`, load_inline calls that keep torch's default C++ flags get `use_pch=True`
    (see `pch_usable`). torch deletes its PCH whenever a build does not use it; that deletion
    is switched off here, so one candidate with its own flags does not cost the next one a rebuild.
    In the trusted builder (`publish`), calls with their own simple flags get a header made for
    those flags, kept in the shared cache (`flag_pch.py`, at most `flag_pch_keep`; 0: none).
    With `lean_headers`, CUDA sources are first built with lean torch headers (see
    `lean_headers.py`); when that build fails the source is built as written, and a marker in the
    lean build's directory makes the next evaluation of the same source skip the lean attempt.

    The trusted cache (docs/SANDBOX.md): with `private_root`, this process (an evaluation, which
    runs candidate code) never writes the shared cache. A call whose shared directory is named in
    `verified` (directory name -> sha256 of its artefact, handed over by the parent) loads a copy
    of the artefact whose hash matched; every other call (not prebuilt, or a hash mismatch) is
    built under `private_root`, used once; a call named in `failed` (directory name -> compiler
    output) failed in the trusted builder and fails here with that output, without building again.
    `publish` is the trusted builder's side: it builds into
    the shared cache, records each artefact's sha256 next to it (MANIFEST), and rebuilds from
    scratch a directory whose artefact has no such record.
    """
    import torch.utils.cpp_extension as cpp_ext

    root = Path(cache_root)
    if private_root is None:
        root.mkdir(parents=True, exist_ok=True)
    # torch decodes a failed build's output strictly: one byte that is not UTF-8 in the compiler's
    # output (seen on an H100 host) turned a compile error into a UnicodeDecodeError from torch
    if not getattr(cpp_ext, "IS_WINDOWS", False):
        cpp_ext.SUBPROCESS_DECODE_ARGS = ("utf-8", "replace")
    original_inline = cpp_ext.load_inline
    original_load = cpp_ext.load
    if use_pch and hasattr(cpp_ext, "remove_extension_h_precompiler_headers"):
        cpp_ext.remove_extension_h_precompiler_headers = lambda *a, **k: None
    else:
        _tolerate_read_only_torch(cpp_ext)

    routes = _BuildRoutes(
        root,
        candidate_file,
        use_pch,
        lean_headers,
        verified,
        private_root,
        publish,
        failed,
        flag_pch_keep,
        original_inline,
        original_load,
    )

    @functools.wraps(original_inline)
    def load_inline(
        name: str, cpp_sources: _Sources, cuda_sources: _Sources = None, *args: Any, **kwargs: Any
    ) -> types.ModuleType | None:
        return routes.load_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    @functools.wraps(original_load)
    def load(name: str, sources: str | Iterable[str], *args: Any, **kwargs: Any) -> types.ModuleType | None:
        return routes.load(name, sources, *args, **kwargs)

    cpp_ext.load_inline = load_inline
    cpp_ext.load = load


# ---- the trusted cache --------------------------------------------------------------------


def _same_build(table: dict[str, str], dir_name: str, key: str) -> str | None:
    """The directory in `table` (the parent's verified or failed builds) for this call: its own,
    else one of the same key under another name (the trusted builder saw the call made with a name
    that changes from process to process). The artefact is then loaded under the name it was built
    with: the module's Python name differs, its code is the same call's."""
    if dir_name in table:
        return dir_name
    return next((d for d in sorted(table) if d.endswith(f"-{key}") and len(d) > len(key) + 1), None)


MANIFEST = "kw-artefact.json"  # {"artefact": file name, "sha256": ...}, written by the trusted builder


def _artefact(build_dir: Path, name: str) -> Path:
    import torch.utils.cpp_extension as cpp_ext

    return build_dir / f"{name}{cpp_ext.LIB_EXT}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record_artefact(build_dir: Path, name: str) -> str:
    """The trusted builder's record of a built artefact's hash (kept when it is already there)."""
    manifest = build_dir / MANIFEST
    try:
        known = json.loads(manifest.read_text())
        recorded = known.get("sha256") if isinstance(known, dict) else None
        if isinstance(recorded, str):
            return recorded
    except (OSError, ValueError):
        pass
    digest = _sha256(_artefact(build_dir, name))
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"artefact": _artefact(build_dir, name).name, "sha256": digest}))
    os.replace(tmp, manifest)
    return digest


TORCH_BATON = "lock"  # torch.utils.cpp_extension's FileBaton file inside a build directory


def _hold_build_dir(build_dir: Path) -> IO[str] | None:
    """Take the flock beside `build_dir` (released by the kernel however its holder ends) and remove
    a stale torch baton inside it; returns the open lock file (close it to release), or None where
    flock is unavailable.

    torch marks a build in progress with a file `lock` in the build directory and makes every other
    build of that directory wait while the file exists, with no limit and no check that its owner
    lives. A build killed on its time limit, by a signal or by the out-of-memory killer leaves the file
    behind, and every later build of the same sources then waits for ever: each evaluation of that
    candidate would end as a time-out (it happens after a build was stopped at its time limit).
    Every kernelwright build of a directory holds this flock first, so a baton found while holding it
    belongs to a builder that is gone."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's baton alone
        return None
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        lock = open(build_dir.parent / f".{build_dir.name}.lock", "w")
    except OSError:  # a directory this process cannot write (a read-only cache): torch's error follows
        return None
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        (build_dir / TORCH_BATON).unlink()
    except FileNotFoundError:
        pass
    return lock


def _clear_unrecorded(build_dir: Path, name: str) -> None:
    """A shared directory with an artefact but no record of its hash was not built by a trusted
    builder (or was tampered with): its objects cannot be trusted either, so it is built afresh."""
    if _artefact(build_dir, name).exists() and not (build_dir / MANIFEST).exists():
        import shutil

        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)


def _load_verified(
    name: str, build_dir: Path, expected: str, private_root: Path, entry: dict[str, Any]
) -> types.ModuleType | None:
    """Load a copy of the shared artefact when its bytes hash to `expected`, else None (and say why).

    The copy is what gets hashed and loaded, so the shared file cannot change in between."""
    import torch.utils.cpp_extension as cpp_ext

    try:
        data = _artefact(build_dir, name).read_bytes()
    except OSError as exc:
        entry["cache"] = f"rejected: {exc.strerror or 'unreadable'}"
        return None
    if hashlib.sha256(data).hexdigest() != expected:
        entry["cache"] = "rejected: hash mismatch"
        return None
    copy_dir = private_root / f"verified-{build_dir.name}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    _artefact(copy_dir, name).write_bytes(data)
    entry["cache"] = "verified"
    try:
        module: types.ModuleType = cpp_ext._import_module_from_library(name, str(copy_dir), True)
        return module
    except Exception as exc:  # it built (the trusted builder never imports), but cannot be loaded
        text = load_failure_text(name, exc)
        issues = parse_compiler_output(text, None)
        entry.update(ok=False, output=text, issues=[asdict(i) for i in issues])
        raise CandidateBuildError(name, text, issues) from None


def load_failure_text(name: str, exc: BaseException) -> str:
    """The record's text for a build call that failed outside the compiler (import, arguments)."""
    return (
        f"Error building extension '{name}': the build call failed outside the compiler "
        f"({type(exc).__name__}), e.g. the module built but cannot be imported (a symbol declared and "
        f"never defined):\n{exc}"
    )


def _functions(module: Any) -> list[str]:
    return sorted(a for a in dir(module) if not a.startswith("_") and callable(getattr(module, a, None)))[:50]


def _as_keywords(
    original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], after: int = 3
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """load_inline's (or load's) positional extras as keywords, and arguments equal to their defaults
    dropped, so a call keys the same however it is written (the trusted builder calls with keywords).
    `after`: the parameters taken before the extras (name, cpp, cuda; for load: name, sources)."""
    import inspect

    try:
        params = list(inspect.signature(original).parameters.values())[after:]
    except (TypeError, ValueError):
        return args, kwargs
    if len(args) > len(params):
        return args, kwargs
    merged = dict(kwargs)
    for p, v in zip(params, args, strict=False):
        if p.name in merged:
            return args, kwargs  # a TypeError for load_inline to raise
        merged[p.name] = v
    defaults = {p.name: p.default for p in params}
    return (), {k: v for k, v in merged.items() if not (k in defaults and k != "use_pch" and _same(v, defaults[k]))}


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


# ---- a build that cannot succeed, found before the compiler runs ----------------------------------


# Global C library functions that <torch/extension.h> brings into scope: a `functions` entry with
# one of these names may bind without a declaration of the candidate's own.
def _functions_line(candidate_file: str | None, name: str) -> int | None:
    """The candidate's line where `name` is listed in a `functions=` argument."""
    if not candidate_file:
        return None
    try:
        tree = parse_python(Path(candidate_file).read_text())
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "functions":
            for c in ast.walk(node.value):
                if isinstance(c, ast.Constant) and c.value == name:
                    return c.lineno
    return None


def _precheck_functions(
    original_inline: Callable[..., Any],
    name: str,
    cpp_sources: _Sources,
    cuda_sources: _Sources,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    candidate_file: str | None,
) -> None:
    """Raise CandidateBuildError at once (no compiler run) for a name in `functions` nothing declares."""
    import inspect

    try:
        bound = inspect.signature(original_inline).bind(name, cpp_sources, cuda_sources, *args, **kwargs)
    except TypeError:
        return  # a call torch itself will reject: leave it to torch
    functions = bound.arguments.get("functions")
    if module_defined_twice(cpp_sources, name, functions):
        message = (
            f"cpp_sources define the module themselves (PYBIND11_MODULE) and load_inline(functions=[...]) "
            f"asks torch to define it too: main.cpp would hold two definitions of PyInit_{name}, so this build "
            f"cannot succeed. Drop functions=..., or drop the PYBIND11_MODULE block from cpp_sources"
        )
        output = (
            f"Error building extension '{name}': found before compiling (no compiler was run):\n"
            f"main.cpp: error: redefinition of 'PyObject* PyInit_{name}()'\n{message}"
        )
        _fail_before_compiling(name, output, CompileIssue(message=message))
    missing = undeclared_functions(cpp_sources, functions)
    if not missing:
        return
    cuda_text = "\n".join(_as_list(cuda_sources))
    first = missing[0]
    if re.search(rf"__global__[^;{{]*\b{re.escape(first)}\s*\(", cuda_text):
        hosts = [h for h in re.findall(r"torch::Tensor\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", cuda_text) if h != first]
        example = (
            f"`torch::Tensor {hosts[0]}(torch::Tensor x);`" if hosts else "`torch::Tensor launch(torch::Tensor x);`"
        )
        message = (
            f"load_inline(functions=[...]) names '{first}', a __global__ kernel in cuda_sources, which no C++ "
            f"source declares: torch binds each name in main.cpp, which holds only cpp_sources (cuda_sources "
            f"compile separately), and a kernel cannot be called from Python anyway, so this build cannot "
            f"succeed. Bind the host function that launches it: declare it in cpp_sources, e.g. {example}, "
            f"and name that in functions"
        )
    else:
        message = (
            f"load_inline(functions=[...]) names '{first}', which no C++ source declares: torch binds each name "
            f"in main.cpp, which holds only cpp_sources (cuda_sources compile separately), so this build cannot "
            f"succeed. Declare it in cpp_sources, e.g. `torch::Tensor {first}(torch::Tensor x);`, or drop it "
            f"from functions"
        )
    if len(missing) > 1:
        message += f" (also undeclared: {', '.join(missing[1:])})"
    output = (
        f"Error building extension '{name}': found before compiling (no compiler was run):\n"
        f"main.cpp: error: '{first}' was not declared in this scope\n{message}"
    )
    _fail_before_compiling(
        name, output, CompileIssue(message=message, candidate_line=_functions_line(candidate_file, first))
    )


def _fail_before_compiling(name: str, output: str, issue: CompileIssue) -> NoReturn:
    """Record a build the precheck found cannot succeed, and raise its CandidateBuildError."""
    BUILD_LOG.append(
        {
            "kind": "inline",
            "name": name,
            "key": "",
            "dir": "",
            "cached": False,
            "ok": False,
            "precheck": True,
            "output": output,
            "issues": [asdict(issue)],
        }
    )
    raise CandidateBuildError(name, output, [issue])


# what could hide or rename a module definition, so that a line-by-line reading is not certain: a
# raw string literal (its lines are not code), a header of the candidate's own ("..." includes), or a
# definition of the names the block is made of
def _fail_as_written(
    name: str, build_dir: Path, key: str, failure: _LeanBuildFailed, candidate_file: str | None
) -> None:
    """A build as written that cannot succeed (`certain_failure`): fail now, with the lean
    build's compiler output, instead of running the compiler again for the same error. Recorded
    under the build as written, so the trusted builder's verdict is replayed by the evaluation."""
    text = failure.output
    issues = parse_compiler_output(text, candidate_file)
    BUILD_LOG.append(
        {
            "kind": "inline",
            "name": name,
            "key": key,
            "dir": str(build_dir),
            "cached": False,
            "ok": False,
            "output": text,
            "issues": [asdict(i) for i in issues],
            "lean_headers": {
                "used": False,
                "tried_s": round(failure.seconds, 2),
                "reason": "main.cpp failed in the lean build; it is the same file as written, "
                "so the build as written was not run",
            },
        }
    )
    raise CandidateBuildError(name, text, issues)


class _LeanBuildFailed(Exception):
    def __init__(self, output: str, seconds: float):
        super().__init__("lean build failed")
        self.output = output
        self.seconds = seconds


LEAN_FAILED = "kw-lean-failed.txt"


def _lean_plan(
    cuda_sources: _Sources, kwargs: dict[str, Any], args: tuple[Any, ...], original_inline: Callable[..., Any]
) -> LeanSources | None:
    """The lean rewrite of a load_inline call's CUDA sources, or None where it does not apply."""
    if not cuda_sources or args or kwargs.get("no_implicit_headers"):
        return None  # positional extra arguments: leave the call exactly as written
    import inspect

    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child.lean_headers import lean_cuda_sources

    try:
        if "no_implicit_headers" not in inspect.signature(original_inline).parameters:
            return None  # a torch too old to build without its implicit <torch/types.h>
    except (TypeError, ValueError):
        return None
    return lean_cuda_sources(_as_list(cuda_sources), Path(cpp_ext._TORCH_PATH) / "include")
