"""The trusted side of the build cache: build before the candidate runs, hand over the hashes.

The shared build cache (`<cache_dir>/builds`) is written only by the trusted builder
(`engine/child/trusted_builder.py`), a child that runs no candidate code, on the calls that
`static_builds.scan` resolved from the candidate's text. The evaluation child gets the cache
read-only under bubblewrap, and in its job the sha256 of every artefact it may load; it loads
an artefact only when the bytes match, and builds anything else privately (`child/build.py`).

Where the hashes come from: the builder reports, per cache entry, the hash recorded when the
entry was built (`build.MANIFEST`). This process remembers every hash it has learned
(`_KNOWN`) and hands over its own memory, not the manifest, when it has one: so in `--sandbox
none`, where a candidate can rewrite both an artefact and its manifest, a poisoned entry is
still refused by every later evaluation of this process (a forge run). A new process trusts
the manifest of an entry it has not built itself; under bubblewrap nothing a candidate runs
can write the cache, so the manifest can be trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.engine import process
from kernelwright.engine.child.build import MANIFEST
from kernelwright.engine.extensions import static_builds
from kernelwright.engine.isolation import containment as isolation
from kernelwright.engine.isolation import sandbox

BUILDS_SUBDIR = "builds"
# the live line while a builder runs: these calls were not built on this machine before
COLD = "not built on this machine before: a first build takes a minute or more"
_KNOWN: dict[tuple[str, str], str] = {}  # (cache root, entry directory) -> sha256 learned by this process
_KNOWN_LOCK = threading.Lock()
# The calls this process has seen built, each with success or with the compiler's error:
# (cache root, calls, build settings) -> (verified, failed, builds). An evaluation whose calls are
# all here needs no builder process (its start-up, a torch import, is most of a cached
# evaluation's overhead, and a failing build is its compiler's whole run again): the hashes are
# this process's own, and the evaluation child still checks the bytes before it loads.
_DONE: dict[str, tuple[dict[str, str], dict[str, str], list[dict[str, Any]]]] = {}
# Calls recorded from a candidate's running code (`record_calls`), by the sha256 of its text.
_RECORDED: dict[str, list[dict[str, Any]]] = {}


@dataclass
class TrustedBuilds:
    verified: dict[str, str] = field(default_factory=dict)  # entry directory name -> sha256
    failed: dict[str, str] = field(default_factory=dict)  # entry directory name -> the compiler's output
    builds: list[dict[str, Any]] = field(default_factory=list)  # what the builder reported, per call
    private: list[str] = field(default_factory=list)  # why other build calls are left to the evaluation
    wall_s: float = 0.0
    error: str = ""  # the builder itself failed (then the evaluation builds everything privately)
    remembered: bool = False  # every call was built before by this process: no builder was started
    recorded: int = 0  # calls with arguments computed at run time, recorded from the candidate's code (`record_calls`)
    memo: dict[str, Any] | None = None  # every call built or failed: what `adopt` teaches another trusted process

    def describe(self) -> dict[str, Any]:
        """The record's `metadata["trusted_build"]`."""
        return {
            "calls": len(self.builds),
            "verified": len(self.verified),
            "wall_s": round(self.wall_s, 3),
            **({"remembered": True} if self.remembered else {}),
            **({"recorded": self.recorded} if self.recorded else {}),
            "private": self.private,
            **({"error": self.error} if self.error else {}),
            "builds": [{k: v for k, v in b.items() if k not in ("sha256", "output")} for b in self.builds],
        }


def cache_root(config: EvalConfig) -> Path:
    return Path(config.cache_dir) / BUILDS_SUBDIR


def build(
    candidate_text: str,
    config: EvalConfig,
    workdir: Path,
    env: dict[str, str],
    arch_list: str | None = None,
    record: bool = False,
    problem_text: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> TrustedBuilds:
    """Build the candidate's statically known extensions in a trusted child; never raises for the candidate.

    `workdir`: a directory of the builder's own; `env`: the evaluation child's environment (the
    builder sees the GPU hidden and builds for `arch_list`, the value the evaluation child sets).
    `record`: where some calls' arguments are computed at run time, run the candidate's
    module-level code in the build recorder first (`record_calls`; a prebuild does, off the
    GPU's path) and build the calls it made too; given `problem_text`, the recorder also constructs
    ModelNew and calls it once on the CPU, for the builds made there. Calls recorded once for a candidate's text (here,
    or `adopt`ed) are built by every later `build` of the same text, recorder or not.
    `on_stage`: the live line's stage while a builder runs ("build: compiling NAME (1 of 2), ...").
    """
    t0 = time.monotonic()
    scan = static_builds.scan(candidate_text)
    out = TrustedBuilds(private=scan.private)
    calls = [c.kwargs for c in scan.calls]
    text_key = hashlib.sha256(candidate_text.encode()).hexdigest()
    recorded = _recorded(out, scan, candidate_text, text_key, config, workdir, env, record, problem_text)
    if recorded:
        extra = [c for c in recorded if c not in calls]
        calls += extra
        out.recorded = len(extra)
        out.private = [p for p in out.private if not _computed(p)]
    if not calls:
        return out
    root = cache_root(config)
    root.mkdir(parents=True, exist_ok=True)
    memo_key = json.dumps(
        [
            str(root.resolve()),
            calls,
            arch_list or "",
            config.build.use_pch,
            config.build.lean_headers,
            env.get("CXX", ""),
        ],
        sort_keys=True,
        default=repr,
    )
    with _KNOWN_LOCK:
        done = _DONE.get(memo_key)
    if done is None:  # built by an earlier process of this machine (a fresh `kernelwright eval`)
        done = _read_done(root, memo_key)
    if done is not None and all((root / d).is_dir() for d in done[0]):
        out.verified, out.failed = dict(done[0]), dict(done[1])
        out.builds = [dict(b, cached=True) for b in done[2]]
        out.remembered = True
        out.memo = {
            "key": memo_key,
            "root": str(root.resolve()),
            "verified": dict(done[0]),
            "failed": dict(done[1]),
            "builds": done[2],
            "recorded": {text_key: recorded} if recorded else {},
        }
        out.wall_s = time.monotonic() - t0
        return out
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    env = dict(env, TMPDIR=str(workdir / "tmp"), CUDA_VISIBLE_DEVICES="")
    if arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    job = {
        "cache_root": str(root),
        "calls": calls,
        "use_pch": config.build.use_pch,
        "flag_pch_keep": config.build.flag_pch_keep,
        "lean_headers": config.build.lean_headers,
    }
    argv = sandbox.wrap(builder_argv(), config.sandbox, workdir, [Path(config.cache_dir)])
    iso = isolation.prepare("cpu", config.sandbox, config.memory_limit_mb)

    def progress(msg: dict[str, Any]) -> None:
        i = msg.get("index")
        if on_stage is not None and msg.get("type") == "building" and type(i) is int and 0 <= i < len(calls):
            name = str(calls[i].get("name") or calls[i].get("load_sources") or "an extension")[:60]
            on_stage(f"build: compiling {name} ({i + 1} of {len(calls)}; {COLD})")

    if on_stage is not None:
        on_stage(f"build: {len(calls)} extension{'s' if len(calls) > 1 else ''}, {COLD}")
    finished = process.run_to_end(
        argv,
        job,
        workdir,
        env,
        config.timeouts.startup + config.timeouts.build,
        name="builder",
        isolation=iso,
        max_line=64 << 20,
        on_message=progress,
    )
    out.wall_s = time.monotonic() - t0
    final = next((m.get("record") for m in finished.messages if m.get("type") == "final"), None)
    if not isinstance(final, dict):
        why = (
            f"timed out after {config.timeouts.build:g} s"
            if finished.timed_out
            else process.describe_signal(finished.exit_code)
        )
        out.error = f"the trusted builder {why}: {finished.log_tail.strip().splitlines()[-1:] or ''}"[:400]
        return out
    for b in final.get("builds", []):
        if not isinstance(b, dict):
            continue
        out.builds.append(b)
        d, digest = b.get("dir"), b.get("sha256")
        if b.get("ok") and isinstance(d, str) and isinstance(digest, str) and "/" not in d:
            with _KNOWN_LOCK:
                out.verified[d] = _KNOWN.setdefault((str(root.resolve()), d), digest)
        elif not b.get("ok") and isinstance(d, str) and "/" not in d and isinstance(b.get("output"), str):
            out.failed[d] = b["output"]
    settled = len(out.verified) + len(out.failed) + sum(1 for b in out.builds if not b.get("ok") and b.get("load"))
    if out.builds and settled == len(out.builds) == len(calls):
        # every call built or failed in its compiler: the next evaluation of the same calls skips the
        # builder (a failure is the compiler's answer to these sources and flags with this toolchain)
        with _KNOWN_LOCK:
            _DONE[memo_key] = (dict(out.verified), dict(out.failed), [dict(b) for b in out.builds])
        _write_done(root, memo_key, _DONE[memo_key])
        out.memo = {
            "key": memo_key,
            "root": str(root.resolve()),
            "verified": dict(out.verified),
            "failed": dict(out.failed),
            "builds": [dict(b) for b in out.builds],
            "recorded": {text_key: recorded} if recorded else {},
        }
    return out


def _computed(why: str) -> bool:
    return "computed at run time" in why or "recorded at run time" in why


def _recorded(
    out: TrustedBuilds,
    scan: Any,
    candidate_text: str,
    text_key: str,
    config: EvalConfig,
    workdir: Path,
    env: dict[str, str],
    record: bool,
    problem_text: str | None,
) -> list[dict[str, Any]] | None:
    """The calls recorded for this text (this process's memory, an earlier process's memo, or, with
    `record`, the build recorder now); `out.private` gains why a recording failed or refused a call."""
    if not any(_computed(p) for p in scan.private):
        return None
    with _KNOWN_LOCK:
        recorded = _RECORDED.get(text_key)
    if recorded is None:  # recorded by an earlier process (a prebuild, another eval)
        recorded = _read_recorded(config, text_key)
    if recorded is not None or not record:
        return recorded
    rec = record_calls(candidate_text, config, workdir / "recorder", env, problem_text)
    if not rec.ended:  # died or stopped before its record: one more start (a loaded machine, a killed child)
        rec = record_calls(candidate_text, config, workdir / "recorder-again", env, problem_text)
    if rec.ended:  # only a recorder that reached its end says which calls a text makes; a later build reads this
        with _KNOWN_LOCK:
            _RECORDED[text_key] = rec.calls
        _write_memo(cache_root(config) / MEMO_DIR / f"recorded-{text_key}.json", {"calls": rec.calls})
    # nothing recorded by a recorder that failed: the computed calls stay the evaluation's, and the reason says why
    drop = rec.ended or bool(rec.calls)
    out.private = rec.refused + [p for p in out.private if not (drop and _computed(p))]
    return rec.calls


def adopt(memo: dict[str, Any]) -> None:
    """Learn what another trusted process built (`TrustedBuilds.memo`, from a prebuild in the
    executor's driver): an evaluation here of the same calls then starts no builder process.

    Only for a memo from trusted code (the driver that ran the builder), never from a candidate.
    Hashes this process learned before win, as in `build`; the evaluation child still checks the
    bytes against them before it loads."""
    try:
        key, root = str(memo["key"]), str(memo["root"])
        verified = {str(d): str(h) for d, h in dict(memo["verified"]).items() if "/" not in str(d)}
        failed = {str(d): str(o) for d, o in dict(memo.get("failed") or {}).items() if "/" not in str(d)}
        builds = [dict(b) for b in memo["builds"] if isinstance(b, dict)]
    except (KeyError, TypeError, ValueError, AttributeError):
        return
    recorded = {}
    for text_key, calls in dict(memo.get("recorded") or {}).items():  # checked again: this process trusts no text
        accepted = [kw for kw, _ in map(static_builds.check_recorded, calls if isinstance(calls, list) else []) if kw]
        recorded[str(text_key)] = accepted
    with _KNOWN_LOCK:
        verified = {d: _KNOWN.setdefault((root, d), h) for d, h in verified.items()}
        _DONE.setdefault(key, (verified, failed, builds))
        for text_key, accepted in recorded.items():
            _RECORDED.setdefault(text_key, accepted)


@dataclass
class Recording:
    """What the build recorder reported (`record_calls`)."""

    calls: list[dict[str, Any]]  # accepted calls, checked as hostile input
    refused: list[str]  # why each other call was refused; why nothing was recorded, where the recorder failed
    ended: bool  # the recorder sent its final record (else: the calls it reported before it stopped)


def record_calls(
    candidate_text: str, config: EvalConfig, workdir: Path, env: dict[str, str], problem_text: str | None = None
) -> Recording:
    """The load_inline calls the candidate's code makes (`child/build_recorder.py`, in the sandbox,
    no GPU): at import, and given the problem, in `ModelNew.__init__` and its first call on the CPU;
    each checked as hostile input."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    cand = workdir / "candidate.py"
    cand.write_text(candidate_text)
    job: dict[str, Any] = {"candidate_path": str(cand)}
    if problem_text is not None:
        (workdir / "problem.py").write_text(problem_text)
        job["problem_path"] = str(workdir / "problem.py")
    env = dict(env, TMPDIR=str(workdir / "tmp"), CUDA_VISIBLE_DEVICES="")
    argv = sandbox.wrap(
        [sys.executable, "-u", "-m", "kernelwright.engine.child.build_recorder"], config.sandbox, workdir, []
    )
    iso = isolation.prepare("cpu", config.sandbox, config.memory_limit_mb)
    done = process.run_to_end(
        argv,
        job,
        workdir,
        env,
        config.timeouts.startup + config.timeouts.init,
        name="recorder",
        isolation=iso,
        max_line=16 << 20,
    )
    record = next((m.get("record") for m in done.messages if m.get("type") == "final"), None)
    raw = record.get("calls") if isinstance(record, dict) else None
    ended = raw is not None
    accepted: list[dict[str, Any]] = []
    refused: list[str] = []
    if raw is None:  # stopped before its final record: the calls it reported on the way
        raw = [m.get("call") for m in done.messages if m.get("type") == "call"]
        if not raw:
            why = (
                f"timed out after {config.timeouts.startup + config.timeouts.init:g} s"
                if done.timed_out
                else process.describe_signal(done.exit_code)
            )
            last = done.log_tail.strip().splitlines()[-1:]
            refused.append(f"the build recorder {why} before it recorded a call{': ' + last[0][:200] if last else ''}")
    for call in (raw if isinstance(raw, list) else [])[:16]:
        kwargs, why = static_builds.check_recorded(call)
        if kwargs is None:
            refused.append(f"a call recorded at run time: {why}")
        elif kwargs not in accepted:
            accepted.append(kwargs)
    return Recording(accepted, refused, ended)


# ---- what earlier processes of this machine built, kept beside the cache --------------------
#
# A fresh process (one `kernelwright eval`) would start the builder, a torch import, only to find
# every call built already. Each trusted process writes what it learned into `<cache>/builds/
# .memo/` (the builds a set of calls made, the calls a candidate's text was recorded making),
# keyed by those calls and a stamp of the toolchain; a later process reads it instead. The same
# trust as the entries' own manifests, which a new process already trusts (module docstring):
# under bubblewrap nothing a candidate runs can write the cache; a memo whose entries' manifests
# no longer hold the hashes it names is ignored, and the evaluation child still checks the bytes
# of what it loads. Recorded calls read back are checked as hostile input again.

MEMO_DIR = ".memo"
_DIAGNOSTIC = re.compile(r"(^|\s|:)(fatal )?error( [A-Z]*\d+)?:", re.MULTILINE)
_TRANSIENT = re.compile(r"Killed signal|No space left|Cannot allocate memory|virtual memory exhausted|out of memory")


def _toolchain_stamp() -> str:
    """What a changed toolchain changes, found without importing torch: the versions of torch and
    the compilers' files (path, size, mtime). A new toolchain reads no memo of the old one."""
    import importlib.metadata
    import shutil

    parts = []
    try:
        parts.append(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        parts.append("no torch")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for tool in (os.environ.get("CXX") or "c++", os.path.join(cuda_home, "bin", "nvcc")):
        path = shutil.which(tool) or tool
        try:
            st = os.stat(os.path.realpath(path))
            parts.append(f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}")
        except OSError:
            parts.append(f"{tool}: none")
    return "|".join(parts)


def _memo_path(root: Path, memo_key: str) -> Path:
    digest = hashlib.sha256(f"{memo_key}\n{_toolchain_stamp()}".encode()).hexdigest()[:32]
    return root / MEMO_DIR / f"done-{digest}.json"


def _write_memo(path: Path, data: dict[str, Any]) -> None:
    """Best effort, atomic (a reader sees the whole file or none)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data, default=repr))
        os.replace(tmp, path)
    except OSError:
        pass


def _write_done(root: Path, memo_key: str, done: tuple[dict[str, str], dict[str, str], list[dict[str, Any]]]) -> None:
    verified, failed, builds = done
    # a failure outlives this process only as the compiler's own diagnostic: a compiler killed for
    # memory or a full disk says no `error:`, and is built again by the next process
    if any(not _DIAGNOSTIC.search(output) or _TRANSIENT.search(output) for output in failed.values()):
        return
    _write_memo(_memo_path(root, memo_key), {"verified": verified, "failed": failed, "builds": builds})


def _read_done(root: Path, memo_key: str) -> tuple[dict[str, str], dict[str, str], list[dict[str, Any]]] | None:
    """An earlier process's builds of these calls, when every verified entry's manifest still holds
    the hash it names; the hashes are then learned as `build` learns the builder's."""
    try:
        data = json.loads(_memo_path(root, memo_key).read_text())
        verified = {str(d): str(h) for d, h in dict(data["verified"]).items() if "/" not in str(d)}
        failed = {str(d): str(o) for d, o in dict(data.get("failed") or {}).items() if "/" not in str(d)}
        builds = [dict(b) for b in data["builds"] if isinstance(b, dict)]
        for d, h in verified.items():
            if json.loads((root / d / MANIFEST).read_text()).get("sha256") != h:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    with _KNOWN_LOCK:
        verified = {d: _KNOWN.setdefault((str(root.resolve()), d), h) for d, h in verified.items()}
        _DONE.setdefault(memo_key, (verified, failed, builds))
    return verified, failed, builds


def _read_recorded(config: EvalConfig, text_key: str) -> list[dict[str, Any]] | None:
    try:
        data = json.loads((cache_root(config) / MEMO_DIR / f"recorded-{text_key}.json").read_text())
        calls = data["calls"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    accepted = [kw for kw, _ in map(static_builds.check_recorded, calls if isinstance(calls, list) else []) if kw]
    with _KNOWN_LOCK:
        _RECORDED.setdefault(text_key, accepted)
    return accepted


def builder_argv() -> list[str]:
    return [sys.executable, "-u", "-m", "kernelwright.engine.child.trusted_builder"]


def forget() -> None:
    """Drop the hashes and builds this process has learned (tests)."""
    with _KNOWN_LOCK:
        _KNOWN.clear()
        _DONE.clear()
        _RECORDED.clear()


def job_fields(trusted: TrustedBuilds | None, workdir: Path) -> dict[str, Any]:
    """What the evaluation child's job carries: the hashes it may load, the compiler output of the
    builds that failed (reported without building again), and its private build directory."""
    if trusted is None:
        return {}
    return {
        "verified_builds": dict(trusted.verified),
        "failed_builds": dict(trusted.failed),
        "private_builds": str(workdir / "private-builds"),
    }
