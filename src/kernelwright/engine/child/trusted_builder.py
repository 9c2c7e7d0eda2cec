"""The trusted builder: builds a candidate's statically known extensions into the shared cache.

    python -m kernelwright.engine.child.trusted_builder JOB.json

It runs no candidate code: it never imports the candidate, and it never loads what it builds
(torch's `load_inline` builds, then imports the module; the import is switched off here, so
not even a static initialiser of the candidate's C++ runs). It gets the calls already resolved
by the parent (`engine/extensions/static_builds.py`: literal arguments, allow-listed flags), builds each
through the same content-keyed cache as an evaluation (`build.install_build_cache`, lean headers
and PCH included) and records each artefact's sha256 in the cache (`build.MANIFEST`).

It reports on the pipe named by the job's `fd`, like the evaluation child: a `build` stage, then
one final record `{"builds": [{"name", "key", "dir", "ok", "cached", "sha256", "error", "output"}, ...]}`
(`output`: the compiler's output of a failed build, which the evaluation reports as its own).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

MAX_OUTPUT = 100_000  # characters of a failed build's compiler output handed back


def main(job_path: str) -> int:
    from kernelwright.engine.child import heap

    heap.keep_tunables_to_itself()  # (glibc's setting stays with this process; the compilers it starts go without)
    with open(job_path) as f:
        job = json.load(f)
    fd = job.get("fd")

    def send(kind: str, **payload: Any) -> None:
        if fd is None:
            return
        data = (json.dumps({"type": kind, "t": time.time(), **payload}) + "\n").encode()
        while data:
            data = data[os.write(fd, data) :]

    send("stage", stage="build")
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child import build

    cpp_ext._import_module_from_library = lambda *args, **kwargs: None  # build, never load
    build.install_build_cache(
        job["cache_root"],
        None,
        use_pch=job.get("use_pch", False),
        lean_headers=job.get("lean_headers", False),
        publish=True,
        flag_pch_keep=job.get("flag_pch_keep", 0),
    )
    results = []
    for i, call in enumerate(job["calls"]):
        send("building", index=i)  # the parent's live line: which of its calls compiles now
        before = len(build.BUILD_LOG)
        error = ""
        t0 = time.perf_counter()
        try:
            if "load_sources" in call:  # a recorded load() of files the candidate wrote: written here
                _load_from_files(cpp_ext, call, job["cache_root"])
            else:
                cpp_ext.load_inline(**call)
        except Exception as exc:  # the evaluation builds it again, privately, and reports the error
            error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        done = [e for e in build.BUILD_LOG[before:] if e.get("ok")]
        # where the call's time went (evidence for benchmarks/cold_builds.py): the whole call, the
        # lean-header attempt (used, or failed first and how long it took), a precheck's failure
        seen = build.BUILD_LOG[before:]
        how: dict[str, Any] = {"call_s": round(time.perf_counter() - t0, 3)}
        lean = next((e["lean_headers"] for e in reversed(seen) if isinstance(e.get("lean_headers"), dict)), None)
        if lean is not None:
            how["lean_headers"] = {k: lean[k] for k in ("used", "tried_s", "reason") if k in lean}
        if any(e.get("precheck") for e in seen):
            how["precheck"] = True
        if done:
            e = done[-1]
            results.append(
                {
                    "name": e["name"],
                    "key": e.get("key"),
                    "dir": os.path.basename(e["dir"]),
                    "ok": True,
                    "cached": bool(e.get("cached")),
                    "sha256": e.get("sha256"),
                    "build_s": round(e.get("build_s") or 0.0, 3),
                    "pch": e.get("pch", False),  # torch's header (True), one for the call's flags ("flags")
                    **how,
                }
            )
        else:
            failed = [e for e in build.BUILD_LOG[before:] if e.get("ok") is False and e.get("output")]
            res = {"name": call.get("name"), "ok": False, "error": error or "the build failed", **how}
            if "load_sources" in call and not _self_contained(call):  # files the candidate's directory may
                res["load"] = True  # complete (a header it wrote beside them): the evaluation builds it itself
            elif failed:  # the compiler's verdict: the evaluation reports it without building again
                res.update(
                    key=failed[-1].get("key"),
                    dir=os.path.basename(failed[-1]["dir"]),
                    output=failed[-1]["output"][-MAX_OUTPUT:],
                )
            results.append(res)
    send("final", record={"builds": results})
    return 0


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def _self_contained(call: dict[str, Any]) -> bool:
    """Did the builder have every file this recorded load() could read? Each `#include "..."` of
    its sources names one of them, and no include path of the candidate's is given: then its
    compiler's failure is the candidate's own, and replayed like a load_inline's."""
    if call.get("extra_include_paths"):
        return False
    names = {os.path.basename(str(n)) for n, _ in call["load_sources"]}
    return all(inc in names for _, text in call["load_sources"] for inc in _QUOTED_INCLUDE.findall(str(text)))


def _load_from_files(cpp_ext: Any, call: dict[str, Any], cache_root: str) -> None:
    """`load(name, sources=[...])` on the files the recorder read from the candidate's directory
    (`load_sources`: [file name, text] pairs, checked by `static_builds.check_recorded`), written into
    a directory of this builder's own: the cache keys a load() call by its files' contents."""
    import tempfile

    kwargs = {k: v for k, v in call.items() if k != "load_sources"}
    with tempfile.TemporaryDirectory(prefix="kw-load-sources-") as d:
        paths = []
        for file_name, text in call["load_sources"]:
            path = os.path.join(d, os.path.basename(str(file_name)))
            with open(path, "w") as f:
                f.write(str(text))
            paths.append(path)
        cpp_ext.load(sources=paths, **kwargs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
