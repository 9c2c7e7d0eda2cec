"""`--sanitize`: one forward of a passed CUDA candidate under compute-sanitizer's memcheck.

A kernel that reads past the end of its input often passes every check: torch's caching
allocator keeps the memory around each tensor mapped, and what it holds is finite. With the
caching allocator off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: every tensor is its own cudaMalloc)
memcheck sees each allocation's bounds and reports an access outside them, or a misaligned one,
with the kernel, the thread and the address. The runner runs as under Nsight Compute
(`profile_only`, engine/nsight.py): it constructs ModelNew and runs one forward on the judge's
first trial inputs. What memcheck reports becomes the `memory_error` flag (it fails the verdict
while it is in `GuardConfig.fail_on`, as by default); `metadata["sanitize"]` holds the errors, or
a note saying why nothing ran (a CPU evaluation, no compute-sanitizer on this machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelwright.core.record import Stage, Status

MAX_ERRORS = 20  # memcheck's --print-limit, and the errors kept in the record
PADDING_BYTES = 4096  # memcheck's --padding: unallocated bytes after every allocation

_HEAD = re.compile(r"(Invalid|Misaligned) (__\w+__|\w+) (read|write|atomic)\w* of size (\d+)")
_AT_PC = re.compile(r"^at (0x[0-9a-fA-F]+) in (.+)$")  # at 0xc8 in [file:line:]kernel
_AT_SYM = re.compile(r"^at (.+?)\+(0x[0-9a-fA-F]+)(?: in .*)?$")  # at kernel+0x1b0 [in file:line]
_THREAD = re.compile(r"by thread \(([\d, ]+)\) in block \(([\d, ]+)\)")
_ADDRESS = re.compile(r"Address (0x[0-9a-fA-F]+) is (out of bounds|misaligned|.+)")
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


@dataclass
class MemoryAccessError:
    access: str  # "Invalid __global__ read of size 4 bytes"
    kernel: str = ""
    address: str = ""
    problem: str = ""  # "out of bounds", "misaligned", ...
    thread: str = ""
    block: str = ""
    detail: str = ""  # "and is 4 bytes after the nearest allocation at 0x... of size 65536 bytes"

    def line(self) -> str:
        where = f" in {self.kernel}" if self.kernel else ""
        at = f" at address {self.address} ({self.problem})" if self.address else ""
        who = f", thread ({self.thread}) of block ({self.block})" if self.thread else ""
        return f"{self.access}{where}{at}{who}"


def _kernel_name(text: str) -> str:
    text = re.sub(r"^\S+?:\d+:", "", text.strip())  # cuda-memcheck's "file:line:kernel"
    return text[:300]


def parse(output: str) -> tuple[list[MemoryAccessError], int | None]:
    """(memory access errors, memcheck's error count) from compute-sanitizer's output."""
    errors: list[MemoryAccessError] = []
    count = None
    cur: MemoryAccessError | None = None
    for raw in output.splitlines():
        line = raw.lstrip("=").strip()
        m = _SUMMARY.search(line)
        if m:
            count = int(m.group(1))
            continue
        m = _HEAD.search(line)
        if m:
            cur = MemoryAccessError(access=line[m.start() :][:200])
            if len(errors) < MAX_ERRORS:
                errors.append(cur)
            continue
        if cur is None or not line:
            continue
        if not cur.kernel and (m := _AT_PC.match(line)):
            cur.kernel = _kernel_name(m.group(2))
        elif not cur.kernel and (m := _AT_SYM.match(line)):
            cur.kernel = _kernel_name(m.group(1))
        elif m := _THREAD.search(line):
            cur.thread, cur.block = m.group(1).replace(" ", ""), m.group(2).replace(" ", "")
        elif m := _ADDRESS.search(line):
            cur.address, cur.problem = m.group(1), m.group(2).strip()[:100]
        elif line.startswith("and is ") and not cur.detail:
            cur.detail = line[:200]
    return errors, count


def find_tool(hint: str = "") -> str | None:
    """compute-sanitizer: `hint`, PATH, then $CUDA_HOME/bin and /usr/local/cuda/bin."""
    if hint:
        return hint if os.path.isfile(hint) and os.access(hint, os.X_OK) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = os.path.join(root, "bin", "compute-sanitizer") if root else ""
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def run(
    tool: str,
    child_argv: list[str],
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    timeout: float,
    wrap=lambda argv: argv,
) -> dict[str, Any]:
    """One forward of ModelNew under memcheck; the record's `metadata["sanitize"]`."""
    from kernelwright.engine.nsight import _run, read_report_file

    t0 = time.monotonic()
    record_path = workdir / "sanitize_record.json"
    job = {k: v for k, v in job.items() if k != "fd"}
    config = json.loads(json.dumps(job["config"]))
    config.setdefault("profile", {})["forward_runs"] = 1
    job.update(mode="profile_only", record_path=str(record_path), config=config)
    job_path = workdir / "sanitize_job.json"
    job_path.write_text(json.dumps(job))
    cmd = (
        [
            tool,
            "--tool",
            "memcheck",
            "--print-limit",
            str(MAX_ERRORS),
            # a guard after every allocation: small cudaMallocs are packed back to back, so a read
            # just past one tensor would land in the next one and look valid without it
            "--padding",
            str(PADDING_BYTES),
            "--target-processes",
            "all",
            "--show-backtrace",
            "no",
        ]
        + child_argv
        + [str(job_path)]
    )
    rc, out, timed_out = _run(
        wrap(cmd), dict(env, PYTORCH_NO_CUDA_MEMORY_CACHING="1"), workdir, timeout, workdir / "sanitize.log"
    )
    errors, count = parse(out)
    rec: dict[str, Any] = {
        "ran": True,
        "tool": tool,
        "command": cmd,
        "exit_code": rc,
        "errors": [asdict(e) for e in errors],
        "error_summary": count,
        "wall_s": round(time.monotonic() - t0, 3),
    }
    msgs = read_report_file(record_path)
    if timed_out:
        rec["note"] = f"compute-sanitizer ran past its {timeout:g} s limit (the profile stage's); the group was killed"
    elif not any(m.get("type") == "profiled" for m in msgs) and not errors:
        fail = next((m for m in msgs if m.get("type") == "failure"), {})
        why = str(fail.get("log", "")).strip().splitlines() or [
            out.strip().splitlines()[-1] if out.strip() else "no report"
        ]
        rec["note"] = f"the candidate did not run to the end under compute-sanitizer: {why[0][:300]}"
    return rec


def attach(result, config, workdir: Path, env: dict[str, str], job: dict[str, Any], wrap=lambda argv: argv) -> None:
    """`metadata["sanitize"]` for a passed candidate, and `memory_error` (failing while in fail_on)."""
    from kernelwright.engine.process import child_argv

    if not config.sanitize or result.status is not Status.PASSED:
        return
    if result.device_type != "cuda":
        result.metadata["sanitize"] = {
            "ran": False,
            "note": "--sanitize checks CUDA kernels with compute-sanitizer; this evaluation ran on the CPU",
        }
        return
    tool = find_tool()
    if tool is None:
        result.metadata["sanitize"] = {
            "ran": False,
            "note": "compute-sanitizer not found on PATH, in $CUDA_HOME/bin "
            "or /usr/local/cuda/bin: the candidate was not checked for memory errors "
            "(install the CUDA toolkit's compute-sanitizer)",
        }
        return
    try:
        rec = run(tool, child_argv(), job, workdir, env, config.timeouts.profile, wrap)
    except (OSError, subprocess.SubprocessError) as exc:
        result.metadata["sanitize"] = {
            "ran": False,
            "note": f"compute-sanitizer could not run: {type(exc).__name__}: {str(exc)[:200]}",
        }
        return
    result.metadata["sanitize"] = rec
    if rec["errors"]:
        flag(result, config, [MemoryAccessError(**e) for e in rec["errors"]], rec["error_summary"])


def flag(result, config, errors: list[MemoryAccessError], count: int | None) -> None:
    """Raise `memory_error`; fail the verdict while the flag is in `GuardConfig.fail_on`."""
    n = count if count is not None else len(errors)
    detail = f"compute-sanitizer memcheck: {n} memory access error(s); first: {errors[0].line()}"
    guards = result.metadata.setdefault("guards", {})
    guards.setdefault("flags", {})["memory_error"] = detail
    guards.setdefault("checked", []).append("memory_error")
    if "memory_error" not in config.guards.fail_on:
        return
    guards.setdefault("failed", []).append("memory_error")
    lines = [f"Memory error under compute-sanitizer memcheck (--sanitize, caching allocator off): {n} error(s)"]
    lines += [f"  {e.line()}" + (f"; {e.detail}" if e.detail else "") for e in errors[:5]]
    result.status, result.correct = Status.INCORRECT, False
    result.error_log, result.error_stage = "\n".join(lines), Stage.CORRECTNESS
    result.candidate_ms = result.speedup = result.speedup_vs_compile = None
