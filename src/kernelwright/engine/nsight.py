"""Nsight Compute profile of a correct candidate's own kernels, in an isolated child with a time limit.

The child runs in `profile_only` mode (build from the cache, construct ModelNew, a couple of
forwards; no reference, no timing, no L2 flush) under

    ncu --export <dir>/profile --clock-control none --metrics <fixed set> --kernel-name-base demangled
        [--kernel-name regex:<the candidate's kernels>] --launch-count N --target-processes all
        python -m ...child.runner

(`--clock-control none`: the card's clocks are never changed). The report is then read back with
`ncu --import ... --csv --page raw --print-units base` and parsed into `NcuKernel` records. Metrics
this ncu/GPU does not know are dropped (found by `--query-metrics`, or named by ncu's "Failed to
find metric" error, then retried). When ncu is missing, lacks permission to the counters
(ERR_NVGPUCTRPERM), cannot load its libraries, or profiles nothing, the record says why and the
torch.profiler record of the evaluation child stays the profile.

One profile at a time per machine (`profiling_lock`): two ncu instances profiling the same GPU at
once disturb each other (its counters and kernel replay are the device's). ncu keeps a lock file
of its own in the temporary directory (`/tmp/nsight-compute-lock`); every evaluation runs ncu
with a TMPDIR private to it, so where ncu follows TMPDIR that lock serialises nothing (not
confirmed on the device). The parent takes a lock of its own before it starts ncu, whatever ncu
does; the wait is recorded (`lock_wait_s`) and not charged to the profile's time limit.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelwright.engine.child.gpu_turn import flock_within

STALL_REASONS = (
    "long_scoreboard",
    "short_scoreboard",
    "mio_throttle",
    "lg_throttle",
    "math_pipe_throttle",
    "barrier",
    "wait",
    "not_selected",
    "memory_throttle",
    "no_instruction",
    "membar",
    "dispatch_stall",
    "tex_throttle",
)
_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# The fixed metric set a kernel engineer reads first (see the module docstring of NcuKernel).
METRIC_SETS: dict[str, list[str]] = {
    "judge": [
        "gpu__time_duration.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "dram__bytes.sum.per_second",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "launch__registers_per_thread",
        "launch__shared_mem_per_block_static",
        "launch__shared_mem_per_block_dynamic",
        "launch__block_size",
        "launch__grid_size",
        "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_warps",
        "launch__occupancy_limit_blocks",
        "l1tex__t_sector_hit_rate.pct",
        "lts__t_sector_hit_rate.pct",
        "sm__inst_issued.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "smsp__sass_average_branch_targets_threads_uniform.pct",
        "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    ]
    + [_STALL.format(r) for r in STALL_REASONS],
}

MAX_METRIC_RETRIES = 3


@dataclass
class NcuKernel:
    """One profiled kernel launch, in the units a person reads (us, bytes, GB/s, %)."""

    name: str
    origin: str  # candidate | pytorch | unknown (core/kernel_names.py)
    duration_us: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    dram_read_bytes: float | None = None
    dram_write_bytes: float | None = None
    dram_bandwidth_gbps: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers_per_thread: float | None = None
    shared_mem_per_block_bytes: float | None = None
    block_size: str = ""
    grid_size: str = ""
    occupancy_limiter: str | None = None  # registers | shared_mem | warps | blocks (fewest blocks per SM; ties joined)
    occupancy_limits: dict[str, float] = field(default_factory=dict)  # blocks per SM allowed by each
    l1_hit_rate_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    issue_slots_busy_pct: float | None = None
    tensor_pipe_pct: float | None = None
    branch_uniformity_pct: float | None = None  # branch efficiency: % of branch targets uniform across the warp
    global_load_bytes: float | None = None
    global_store_bytes: float | None = None
    top_stalls: list[tuple[str, float]] = field(default_factory=list)  # (reason, warps stalled per issue)
    metrics: dict[str, float | None] = field(default_factory=dict)  # every parsed metric, base units


@dataclass
class NcuProfile:
    source: str  # "ncu"
    kernels: list[NcuKernel]
    metric_set: str
    metrics_requested: list[str]
    metrics_dropped: list[str]
    report_path: str | None
    csv_path: str | None
    raw_csv: str
    command: list[str]
    ncu_version: str
    wall_s: float
    lock_wait_s: float = 0.0  # waiting for another profile on this machine to finish (not in wall_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NcuUnavailable(Exception):
    """ncu cannot profile here; the message says why (one line)."""


# ---- CSV parsing -----------------------------------------------------------------------------

_SCALE = {
    "nsecond": 1e-3,
    "usecond": 1.0,
    "msecond": 1e3,
    "second": 1e6,  # -> microseconds
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,  # -> bytes
    "byte/second": 1.0,
    "kbyte/second": 1e3,
    "mbyte/second": 1e6,
    "gbyte/second": 1e9,
    "tbyte/second": 1e12,
}
_TIME_UNITS = {"nsecond", "usecond", "msecond", "second"}


def _number(text: str) -> float | None:
    t = (text or "").strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _base_value(value: str, unit: str) -> float | None:
    """A CSV value in base units: time in microseconds, sizes in bytes, rates in bytes/second."""
    v = _number(value)
    if v is None:
        return None
    return v * _SCALE.get((unit or "").strip().lower(), 1.0)


def _csv_rows(text: str) -> list[list[str]]:
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("==")]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    return list(csv.reader(io.StringIO("\n".join(lines[start:]))))


def parse_csv(text: str) -> list[dict[str, Any]]:
    """Rows of `ncu --csv` (raw page: one row per kernel; details page: one row per metric) as
    one dict per kernel launch: {"id", "name", "block_size", "grid_size", "metrics": {name: value}}."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    col = {h: i for i, h in enumerate(header)}
    launches: dict[str, dict[str, Any]] = {}

    def launch(row: list[str]) -> dict[str, Any]:
        kid = row[col["ID"]]
        get = lambda h: row[col[h]] if h in col and col[h] < len(row) else ""  # noqa: E731
        return launches.setdefault(
            kid,
            {
                "id": kid,
                "name": get("Kernel Name"),
                "block_size": get("Block Size"),
                "grid_size": get("Grid Size"),
                "metrics": {},
            },
        )

    if "Metric Name" in col and "Metric Value" in col:  # details page, long format
        for row in rows[1:]:
            if len(row) < len(header):
                continue
            entry = launch(row)
            name = row[col["Metric Name"]]
            unit = row[col["Metric Unit"]] if "Metric Unit" in col else ""
            entry["metrics"][name] = _base_value(row[col["Metric Value"]], unit)
        return list(launches.values())

    fixed = {
        "ID",
        "Process ID",
        "Process Name",
        "Host Name",
        "Kernel Name",
        "Context",
        "Stream",
        "Block Size",
        "Grid Size",
        "Device",
        "CC",
        "Kernel Time",
        "API Stream",
    }
    body = rows[1:]
    units = [""] * len(header)
    if body and not body[0][col["ID"]].strip():  # units row (raw page)
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    for row in body:
        if len(row) < len(header) or not row[col["ID"]].strip():
            continue
        entry = launch(row)
        for h, i in col.items():
            if h in fixed:
                continue
            entry["metrics"][h] = _base_value(row[i], units[i])
    return list(launches.values())


def _first(m: dict[str, float | None], *names: str) -> float | None:
    for n in names:
        if m.get(n) is not None:
            return m[n]
    return None


def to_kernel(launch: dict[str, Any], origin: str) -> NcuKernel:
    m = launch["metrics"]
    limits = {
        k: m[f"launch__occupancy_limit_{k}"]
        for k in ("registers", "shared_mem", "warps", "blocks")
        if m.get(f"launch__occupancy_limit_{k}") is not None
    }
    stalls = [(r, m[_STALL.format(r)]) for r in STALL_REASONS if m.get(_STALL.format(r)) is not None]
    stalls.sort(key=lambda x: -x[1])
    smem = [m.get("launch__shared_mem_per_block_static"), m.get("launch__shared_mem_per_block_dynamic")]
    bw = m.get("dram__bytes.sum.per_second")
    block = launch.get("block_size") or (str(int(m["launch__block_size"])) if m.get("launch__block_size") else "")
    grid = launch.get("grid_size") or (str(int(m["launch__grid_size"])) if m.get("launch__grid_size") else "")
    return NcuKernel(
        name=launch["name"],
        origin=origin,
        duration_us=m.get("gpu__time_duration.sum"),
        sm_throughput_pct=m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        memory_throughput_pct=m.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_throughput_pct=m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_read_bytes=m.get("dram__bytes_read.sum"),
        dram_write_bytes=m.get("dram__bytes_write.sum"),
        dram_bandwidth_gbps=bw / 1e9 if bw is not None else None,
        achieved_occupancy_pct=m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=m.get("sm__maximum_warps_per_active_cycle_pct"),
        registers_per_thread=m.get("launch__registers_per_thread"),
        shared_mem_per_block_bytes=sum(s for s in smem if s is not None) if any(s is not None for s in smem) else None,
        block_size=block,
        grid_size=grid,
        occupancy_limiter=", ".join(k for k, v in limits.items() if v == min(limits.values())) if limits else None,
        occupancy_limits=limits,
        l1_hit_rate_pct=m.get("l1tex__t_sector_hit_rate.pct"),
        l2_hit_rate_pct=m.get("lts__t_sector_hit_rate.pct"),
        issue_slots_busy_pct=m.get("sm__inst_issued.avg.pct_of_peak_sustained_active"),
        tensor_pipe_pct=_first(
            m,
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        ),
        branch_uniformity_pct=m.get("smsp__sass_average_branch_targets_threads_uniform.pct"),
        global_load_bytes=m.get("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"),
        global_store_bytes=m.get("l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"),
        top_stalls=stalls[:3],
        metrics=dict(m),
    )


def kernels_from_csv(
    text: str, candidate_kernels: set[str] | frozenset[str] = frozenset(), binaries: Iterable[bytes] = ()
) -> list[NcuKernel]:
    from kernelwright.core.kernel_names import classify

    return [to_kernel(l, classify(l["name"], candidate_kernels, binaries)) for l in parse_csv(text)]


# ---- failures --------------------------------------------------------------------------------

_MISSING_METRIC_RE = re.compile(r"Failed to find metrics?\s+(?:regex:\^?)?([A-Za-z0-9_]+)")


def missing_metrics(output: str) -> set[str]:
    """Base names of metrics ncu said it does not know."""
    return set(_MISSING_METRIC_RE.findall(output))


def failure_reason(output: str, returncode: int | None) -> str | None:
    """Why ncu could not profile, from its output; None when it seems to have worked."""
    if "ERR_NVGPUCTRPERM" in output:
        return (
            "no permission to the GPU performance counters (ERR_NVGPUCTRPERM): run as root or set "
            "NVreg_RestrictProfilingToAdminUsers=0"
        )
    if "LibraryNotLoaded" in output or "Failed to load" in output and "library" in output.lower():
        return "ncu could not load its libraries (LibraryNotLoaded): a driver/ncu mismatch or a sandbox that hides them"
    if "No kernels were profiled" in output:
        return "ncu profiled no kernels (the filter matched none, or the forward launched none)"
    if "Failed to connect" in output or "not supported on this device" in output.lower():
        line = next((l for l in output.splitlines() if "==ERROR==" in l), output.strip().splitlines()[-1:])
        return f"ncu could not attach: {str(line).strip()[:200]}"
    if returncode not in (0, None):
        errs = [l.strip() for l in output.splitlines() if "==ERROR==" in l]
        tail = errs[-1] if errs else (output.strip().splitlines()[-1] if output.strip() else "")
        # the profiled program's own last words (a Python error, a CUDA error) say more than ncu's
        app = [l.strip() for l in output.splitlines() if l.strip() and not l.startswith("==")]
        said = f" (the program's last output: {' | '.join(app[-3:])[:300]})" if app else ""
        return f"ncu exited with code {returncode}: {tail[:200]}{said}"
    return None


# ---- running ---------------------------------------------------------------------------------


def find_ncu(hint: str = "") -> str | None:
    """The ncu binary: the configured path (only that one when given), else PATH, else CUDA's bin."""
    if hint:
        return hint if os.path.isfile(hint) and os.access(hint, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base:
            p = os.path.join(base, "bin", "ncu")
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
    return None


def _own_build_dirs(builds: Any, config: Any, workdir: Path) -> list[str]:
    """The build directories the runner reported, where they are build directories: under the
    shared build cache or the evaluation's own directory, and directories. The runner's report is
    the candidate's to write; this process reads the files in them (kernel names), and a `dir` that
    named the user's file would otherwise be read here."""
    roots = [os.path.realpath(Path(config.cache_dir) / "builds"), os.path.realpath(workdir)]
    out = []
    for b in builds if isinstance(builds, list) else []:
        d = b.get("dir") if isinstance(b, dict) else None
        if not isinstance(d, str) or not d:
            continue
        real = os.path.realpath(d)
        if any(real.startswith(r + os.sep) for r in roots) and os.path.isdir(real) and not os.path.islink(d):
            out.append(real)
    return out


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float, log: Path) -> tuple[int | None, str, bool]:
    """Run in its own process group; kill the group past `timeout`. (returncode, output, timed_out).

    The log lies where the child (candidate code, under ncu or compute-sanitizer) can write: it is
    made fresh (never through a link left there) and read back through this process's descriptor,
    never by its path, so a link that replaced it cannot turn this into a read of the user's file
    into the record."""
    from kernelwright.engine.process import _create_log

    fd = _create_log(log)
    with os.fdopen(fd, "w+b") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
    return rc, text, timed_out


LOCK_PATH = "/tmp/kernelwright-ncu.lock"


@contextlib.contextmanager
def profiling_lock(max_wait_s: float, path: str | None = None):
    """Hold the machine's profiling lock (an flock on a fixed file shared by every kernelwright
    process); yields the seconds waited. Raises NcuUnavailable after `max_wait_s`. Where the file
    cannot be opened (another user's, say) the profile runs without it."""
    t0 = time.monotonic()
    try:
        fd = os.open(path or LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError:
        yield 0.0
        return
    try:
        if not flock_within(fd, max_wait_s, poll_s=0.1):
            raise NcuUnavailable(
                f"another ncu profile on this machine held the profiling lock for over {max_wait_s:g} s"
            )
        yield time.monotonic() - t0
    finally:
        os.close(fd)  # releases the lock


def _version(ncu: str, env: dict[str, str]) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30, env=env)
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def known_metric_bases(ncu: str, env: dict[str, str], timeout: float = 60) -> set[str]:
    """Base metric names this ncu knows for the visible GPU (empty when the query fails)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(re.findall(r"^([a-z0-9]+__[A-Za-z0-9_]+)\s", out.stdout, re.MULTILINE))


def filter_metrics(metrics: list[str], known: set[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped). launch__* metrics are always kept; an implausibly short `known` keeps all."""
    if len(known) < 50:
        return list(metrics), []
    kept: list[str] = []
    dropped: list[str] = []
    for m in metrics:
        (kept if m.startswith("launch__") or m.split(".")[0] in known else dropped).append(m)
    return kept, dropped


def kernel_filter(names: set[str]) -> str | None:
    """`--kernel-name` value selecting the candidate's kernels (None: profile every launch)."""
    safe = sorted(n for n in names if re.fullmatch(r"\w+", n))
    if not safe:
        return None
    return "regex:.*(" + "|".join(safe) + ").*"


def profile(
    ncu: str,
    child_argv: list[str],
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    timeout: float,
    metric_set: str,
    max_kernels: int,
    candidate_kernels: set[str],
    binaries: list[bytes],
    report_dir: Path,
    wrap=lambda argv, *writable: argv,
) -> NcuProfile:
    """Profile the candidate's forward under ncu, one profile at a time on this machine; raises
    NcuUnavailable with the reason."""
    with profiling_lock(max(600.0, 4 * timeout)) as waited:
        prof = _profile(
            ncu,
            child_argv,
            job,
            workdir,
            env,
            timeout,
            metric_set,
            max_kernels,
            candidate_kernels,
            binaries,
            report_dir,
            wrap,
        )
    prof.lock_wait_s = round(waited, 3)
    return prof


def _write_fresh(path: Path, text: str) -> None:
    """Write `path` as a new file: whatever the profiled candidate left there (a link to a file of
    the user's) is removed, never followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _profile(
    ncu: str,
    child_argv: list[str],
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str],
    timeout: float,
    metric_set: str,
    max_kernels: int,
    candidate_kernels: set[str],
    binaries: list[bytes],
    report_dir: Path,
    wrap,
) -> NcuProfile:
    t0 = time.monotonic()
    deadline = t0 + timeout
    if metric_set not in METRIC_SETS:
        raise NcuUnavailable(f"unknown ncu metric set {metric_set!r}; known: {', '.join(METRIC_SETS)}")
    report_dir.mkdir(parents=True, exist_ok=True)
    metrics, dropped = filter_metrics(METRIC_SETS[metric_set], known_metric_bases(ncu, env))
    record_path = workdir / "ncu_record.json"
    job = {k: v for k, v in job.items() if k != "fd"}
    job.update(mode="profile_only", record_path=str(record_path))
    job_path = workdir / "ncu_job.json"
    job_path.write_text(json.dumps(job))
    stem = report_dir / "profile"
    flt = kernel_filter(candidate_kernels)
    for attempt in range(MAX_METRIC_RETRIES + 1):
        cmd = [
            ncu,
            "--export",
            str(stem),
            "--force-overwrite",
            "--clock-control",
            "none",
            "--target-processes",
            "all",
            "--kernel-name-base",
            "demangled",
            "--launch-count",
            str(max_kernels),
            "--metrics",
            ",".join(metrics),
        ]
        if flt:
            cmd += ["--kernel-name", flt]
        cmd += child_argv + [str(job_path)]
        left = deadline - time.monotonic()
        if left <= 5:
            raise NcuUnavailable(f"ncu ran out of its {timeout:g} s limit (after {attempt} attempts)")
        # the sandbox's writable part: this profile's own folder, no other profile's
        rc, out, timed_out = _run(wrap(cmd, report_dir), env, workdir, left, report_dir / "ncu.log")
        if timed_out:
            raise NcuUnavailable(f"ncu timed out after {timeout:g} s; the process group was killed")
        missing = missing_metrics(out)
        if missing and attempt < MAX_METRIC_RETRIES:
            gone = [m for m in metrics if m.split(".")[0] in missing]
            if not gone:
                break
            dropped += gone
            metrics = [m for m in metrics if m not in gone]
            continue
        break
    reason = failure_reason(out, rc)
    if reason:
        raise NcuUnavailable(reason)
    msgs = read_report_file(record_path)
    if not any(m.get("type") == "profiled" for m in msgs):
        fail = next((m for m in msgs if m.get("type") == "failure"), {})
        why = str(fail.get("log", "")).strip().splitlines()[:1] or ["no report"]
        raise NcuUnavailable(f"the candidate did not run cleanly under ncu: {why[0][:200]}")
    rep = stem.with_suffix(".ncu-rep")
    if not rep.is_file():
        raise NcuUnavailable("ncu wrote no report (no kernel matched, or it could not attach)")
    imp = subprocess.run(
        [
            ncu,
            "--import",
            str(rep),
            "--csv",
            "--page",
            "raw",
            "--print-units",
            "base",
            "--print-kernel-base",
            "demangled",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=max(30.0, deadline - time.monotonic()),
    )
    if imp.returncode != 0 or not imp.stdout.strip():
        raise NcuUnavailable(f"ncu --import failed: {(imp.stderr or imp.stdout).strip()[-200:]}")
    csv_path = report_dir / "profile.csv"
    _write_fresh(csv_path, imp.stdout)
    kernels = kernels_from_csv(imp.stdout, candidate_kernels, binaries)
    if not kernels:
        raise NcuUnavailable("ncu's report holds no kernel rows")
    return NcuProfile(
        source="ncu",
        kernels=kernels,
        metric_set=metric_set,
        metrics_requested=metrics,
        metrics_dropped=dropped,
        report_path=str(rep),
        csv_path=str(csv_path),
        raw_csv=imp.stdout[:200_000],
        command=cmd,
        ncu_version=_version(ncu, env),
        wall_s=time.monotonic() - t0,
    )


def read_report_file(path: Path, max_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    """The runner's reports written to a file (under ncu there is no pipe): read without following
    a link, capped, line by line."""
    import os

    from kernelwright.core.jsonlines import LineReader

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        data = os.read(fd, max_bytes)
    finally:
        os.close(fd)
    return LineReader().feed(data + b"\n")


def attach(result, config, workdir: Path, env: dict[str, str], job: dict[str, Any], wrap=lambda argv: argv) -> None:
    """Profile a passed CUDA candidate with ncu and put the record in `result.metadata["profile"]`.

    The torch.profiler record from the evaluation child moves to `metadata["torch_profile"]`
    when ncu worked; otherwise it stays the profile and `profile["fallback_reason"]` says why.
    """
    from kernelwright.core import kernel_names
    from kernelwright.engine.process import child_argv

    pc = config.profile
    torch_rec = result.metadata.get("profile")
    reason = None
    ncu = None
    if pc.tool == "torch":
        reason = "profile tool is torch (config)"
    elif result.device_type != "cuda":
        reason = "ncu profiles CUDA kernels; this evaluation ran on the CPU"
    else:
        ncu = find_ncu(pc.ncu_path)
        if ncu is None:
            reason = (
                f"ncu not found at {pc.ncu_path}"
                if pc.ncu_path
                else "ncu not found on PATH or in $CUDA_HOME/bin; install Nsight Compute for kernel metrics"
            )
    if reason is None and ncu is not None:  # ncu found, and no reason not to use it
        build_dirs = _own_build_dirs(result.metadata.get("builds", []), config, workdir)
        texts = kernel_names.candidate_texts(job.get("candidate_path"), build_dirs)
        known = kernel_names.candidate_kernel_names(texts)
        report_dir = (
            Path(pc.report_dir)
            if pc.report_dir
            else Path(config.cache_dir)
            / "profiles"
            / (time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{id(result) % 10000}")
        )
        try:
            prof = profile(
                ncu,
                child_argv(),
                job,
                workdir,
                env,
                config.timeouts.profile,
                pc.metric_set,
                pc.max_kernels,
                known,
                kernel_names.read_binaries(build_dirs),
                report_dir,
                wrap,
            )
            result.metadata["profile"] = prof.to_dict()
            if torch_rec is not None:
                result.metadata["torch_profile"] = torch_rec
            return
        except NcuUnavailable as exc:
            reason = str(exc)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"ncu could not run: {type(exc).__name__}: {str(exc)[:200]}"
    if torch_rec is not None:
        torch_rec["fallback_reason"] = reason
    else:
        result.metadata["profile"] = {"source": "none", "fallback_reason": reason}
