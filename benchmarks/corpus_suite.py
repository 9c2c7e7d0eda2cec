"""A published corpus through `kernelwright suite eval`: wall per problem, where it goes, verdicts.

The corpus is not in this repository (its code is another team's): give the path of a JSON file
in CUDA-L1's release format (`{"1": [{"task_id", "ref_code", "custom_code"}, ...], "2": ...}`,
for example `optimized_cuda_code/h100_xsm.json` of github.com/deepreinforce-ai/CUDA-L1) and,
optionally, a KernelBench checkout for the problems' names (`KernelBench/levelN/<id>_<name>.py`).

    # unpack: problems/levelN/<name>.py (the released reference code) and candidates/levelN/<name>.py
    python3 benchmarks/corpus_suite.py unpack h100_xsm.json --out corpus [--kernelbench KB] [--levels 1]
    # run: `kernelwright suite eval` on the unpacked set, then read every record it wrote
    python3 benchmarks/corpus_suite.py run corpus --levels 1 [--limit 100] [--per-level 20] [-- suite eval options]
    # summarise a finished (or resumed) run again, from its records only
    python3 benchmarks/corpus_suite.py summary corpus

`run` writes corpus_suite.json and corpus_suite.md (into $OUT when set, else the corpus folder): the
suite's wall over the problems it ran, the median and p90 wall per problem, each stage's median
(start-up, build, init, correctness, timing, profile) and their sums, each GPU's busy share (the
share of the wall during which an evaluation on that GPU was in correctness, timing or profile, from
the records' stage spans: `kernelwright.suites.accounting`), how long builds waited for a builder
and the GPU for a build, the records' latency to the store, the verdict mix, how many passed kernels
hold at every other size (`size_robust`) and how many are `shape_specific`, the problems whose build
failed or timed out, and the cold builds: the prebuild's wall for each candidate that builds an
extension of its own (median, p90; the issue's ≤ 20 s target). A rerun with the same `--name`
resumes (the store skips what is finished); the summary counts what the records hold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kernelwright.suites.accounting import account  # noqa: E402

STAGES = ("startup_s", "build_s", "init_s", "correctness_s", "timing_s", "profile_s", "total_s")


def _names(kernelbench: Path | None, level: str) -> dict[int, str]:
    """task id -> KernelBench's file stem for that level (`1_Square_matrix_multiplication_`)."""
    if kernelbench is None:
        return {}
    # the repository's root, or its KernelBench/ folder
    tries = (kernelbench / "KernelBench" / f"level{level}", kernelbench / f"level{level}")
    folder = next((f for f in tries if f.is_dir()), None)
    if folder is None:
        print(f"no level{level} folder in {kernelbench} or {kernelbench / 'KernelBench'}: problems named <id>_task")
        return {}
    out: dict[int, str] = {}
    for path in folder.glob("*.py"):
        m = re.match(r"(\d+)_", path.name)
        if m:
            out[int(m.group(1))] = path.stem
    return out


def _read_release(json_path: Path) -> dict:
    """CUDA-L1's release as `{"1": [...], "2": ...}`, from its JSON file or from its later JSON-lines
    form (one `{"level_id", "task_id", "ref_code", "custom_code", ...}` per line)."""
    text = json_path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        data: dict[str, list] = {}
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                data.setdefault(str(row["level_id"]), []).append(row)
        return data


def unpack(json_path: Path, out: Path, kernelbench: Path | None, levels: list[str]) -> int:
    data = _read_release(json_path)
    count = 0
    for level, entries in sorted(data.items()):
        if levels and level not in levels:
            continue
        names = _names(kernelbench, level)
        problems = out / "problems" / f"level{level}"
        candidates = out / "candidates" / f"level{level}"
        problems.mkdir(parents=True, exist_ok=True)
        candidates.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            if not entry.get("ref_code") or not entry.get("custom_code"):
                continue
            task = int(entry["task_id"])
            stem = names.get(task, f"{task}_task")
            (problems / f"{stem}.py").write_text(entry["ref_code"])
            (candidates / f"{stem}.py").write_text(entry["custom_code"])
            count += 1
    print(f"unpacked {count} problem/candidate pairs into {out}")
    return count


def _records(run_root: Path, since: float = 0.0) -> list[dict]:
    """Every evaluation record under the suite's run folder (one eval.json per evaluation), written
    after `since` (a resumed run counts only what it ran itself), with the time it was written."""
    out = []
    for path in sorted(run_root.rglob("eval.json")):
        try:
            written = path.stat().st_mtime
            if written < since:
                continue
            out.append({"path": str(path.relative_to(run_root)), "_written": written, **json.loads(path.read_text())})
        except (OSError, ValueError):
            continue
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarise(records: list[dict], suite_json: dict | None, started_at: float | None = None) -> dict:
    stages = {
        s: [float(r["stage_times"][s]) for r in records if (r.get("stage_times") or {}).get(s) is not None]
        for s in STAGES
    }
    flags: Counter = Counter()
    robust = {"size_robust": 0, "shape_specific": 0, "unknown": 0}
    for r in records:
        guards = (r.get("metadata") or {}).get("guards") or {}
        flags.update((guards.get("flags") or {}).keys())
        if r.get("status") == "passed" and r.get("correct"):
            shapes = (r.get("metadata") or {}).get("shapes") or {}
            tried = shapes.get("tried") or [] if isinstance(shapes, dict) else []
            if "shape_specific" in (guards.get("flags") or {}) or (isinstance(shapes, dict) and shapes.get("failed")):
                robust["shape_specific"] += 1
            elif tried and all(isinstance(t, dict) and t.get("passed") is True for t in tried):
                robust["size_robust"] += 1
            else:
                robust["unknown"] += 1
    build_fail = [r["path"] for r in records if r.get("status") == "compile_error"]
    # cold builds: the prebuild's wall (a CPU-only child: import, recording, the trusted builder's
    # compile) of each candidate that builds an extension of its own (load_inline/load), off the GPU's path
    cold = [
        float(pre["wall_s"])
        for r in records
        if (pre := ((r.get("metadata") or {}).get("executor") or {}).get("prebuild"))
        and pre.get("wall_s") is not None
        and (r.get("metadata") or {}).get("builds")
    ]
    cold_failed = sum(
        1
        for r in records
        if (pre := ((r.get("metadata") or {}).get("executor") or {}).get("prebuild"))
        and not pre.get("ok")
        and (r.get("metadata") or {}).get("builds")
    )
    caught = [r["path"] for r in records if (r.get("metadata") or {}).get("build_failure_caught")]
    totals = stages["total_s"]
    # the pipeline's pace: seconds between one record and the next (builds overlap, so this, not an
    # evaluation's own total, is what a suite of N problems costs per problem)
    written = sorted(r["_written"] for r in records if "_written" in r)
    gaps = [b - a for a, b in zip(written, written[1:], strict=False)]
    work = sum((r.get("stage_times") or {}).get("correctness_s") or 0.0 for r in records) + sum(
        (r.get("stage_times") or {}).get("timing_s") or 0.0 for r in records
    )
    summary = {
        "evaluations": len(records),
        "verdicts": dict(Counter(r.get("status") for r in records).most_common()),
        "wall_per_problem_s": {
            "median": statistics.median(totals) if totals else None,
            "p90": _pct(totals, 0.9),
            "max": max(totals) if totals else None,
        },
        "seconds_between_records": {
            "median": round(statistics.median(gaps), 2) if gaps else None,
            "mean": round((written[-1] - written[0]) / len(gaps), 2) if gaps else None,
        },
        "correctness_plus_timing_s": round(work, 1),
        "stage_median_s": {s: (round(statistics.median(v), 3) if v else None) for s, v in stages.items()},
        "stage_sum_s": {s: round(sum(v), 1) for s, v in stages.items()},
        "flags": dict(flags.most_common()),
        "passed_kernels_by_size": robust,
        "builds_in_prebuild_s": {
            "candidates": len(cold),
            "median": round(statistics.median(cold), 2) if cold else None,
            "p90": _pct(cold, 0.9),
            "max": max(cold) if cold else None,
            "not_ok": cold_failed,
        },
        "compile_errors": build_fail,
        "build_failures_caught": caught,
    }
    wall = float(suite_json["wall_s"]) if suite_json and suite_json.get("wall_s") else None
    # where the wall went (suites/accounting.py): per problem, each stage's sum, each GPU's busy share
    # from the records' stage spans, the builds' waits, the records' latency to the store
    summary["accounting"] = account(records, wall, started_at if wall is not None else None)
    summary["gpu_busy_share"] = summary["accounting"]["gpu_busy"]["share"]
    if suite_json:
        summary["suite_wall_s"] = suite_json.get("wall_s")
        ran = len(suite_json.get("ran") or [])
        if ran:
            summary["suite_wall_per_problem_s"] = round(float(suite_json.get("wall_s") or 0.0) / ran, 3)
    return summary


def rows(records: list[dict]) -> list[dict]:
    """One compact line per evaluation: what it was, where its time went, what it said."""
    out = []
    for r in sorted(records, key=lambda r: r.get("_written", 0.0)):
        m = r.get("metadata") or {}
        t = m.get("timing") or {}
        lines = [x for x in (r.get("error_log") or "").strip().splitlines() if x.strip()]
        # its first line says where, its last what (a traceback's exception): a row says both
        error = lines[0][:200] + (" ... " + lines[-1].strip()[:200] if len(lines) > 1 else "") if lines else ""
        out.append(
            {
                "problem": "/".join(str(r.get("path", "")).split("/")[:2]),  # level2/1_task
                "status": r.get("status"),
                "speedup": r.get("speedup"),
                "error": error,
                "stages": {
                    k: round(v, 2) for k, v in (r.get("stage_times") or {}).items() if isinstance(v, int | float) and v
                },
                "idle_s": (m.get("prestarted") or {}).get("idle_s"),
                "engine": m.get("engine_phases_s"),
                "judge_busy": m.get("judge_busy_s"),
                "timing": {
                    "calls": t.get("calls_per_window"),
                    "windows": len(t.get("windows") or []),
                    "phases": t.get("judge_phases_s"),
                    "attempts": t.get("attempts"),
                },
                "trusted_build_s": (m.get("trusted_build") or {}).get("wall_s"),
                # why a build ran on the GPU's path: what the prebuild said, what the evaluation's builder did
                "prebuild": (m.get("executor") or {}).get("prebuild"),
                "trusted": {k: v for k, v in (m.get("trusted_build") or {}).items() if k != "builds"},
                "builds": [
                    {k: b.get(k) for k in ("name", "cache", "built_as", "ok", "build_s") if b.get(k) is not None}
                    for b in m.get("builds") or []
                ],
                "flags": sorted(((m.get("guards") or {}).get("flags") or {}).keys()),
                # a shape-specific kernel's sizes and what happened there (the flag's own words)
                "shape_specific": (((m.get("guards") or {}).get("flags") or {}).get("shape_specific") or "")[:600],
                "written": round(r.get("_written", 0.0), 2),
            }
        )
    return out


def _write(summary: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "corpus_suite.json").write_text(json.dumps(summary, indent=2, default=str))
    lines = [f"# corpus suite ({summary.get('when', '')}, {summary.get('device', '')})", ""]
    for key, value in summary.items():
        if key in ("when", "device"):
            continue
        lines.append(f"- **{key}**: {json.dumps(value, default=str)}")
    (out_dir / "corpus_suite.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _device() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run(
    corpus: Path,
    levels: list[str],
    limit: int | None,
    name: str,
    extra: list[str],
    time_limit: float | None,
    keys: set[str] | None = None,
    per_level: int | None = None,
) -> int:
    problems = [corpus / "problems" / f"level{lv}" for lv in levels]
    cands = corpus / "candidates"  # levelN/<stem>.py: the suite pairs them by key (level2/1_task)
    chosen: list[str] = []
    for lv in levels:
        files = sorted((cands / f"level{lv}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
        chosen += [f"level{lv}/{f.stem}" for f in (files[:per_level] if per_level else files)]
    if keys is not None:  # these problems only (`benchmarks/timer_agreement.py`)
        chosen = [c for c in chosen if c in keys]
    if limit:
        chosen = chosen[:limit]
    only: list[str] = []
    for key in chosen:
        only += ["--only", key]
    out_root = corpus / "runs" / name
    store = corpus / "runs" / "store.db"
    cmd = [
        sys.executable, "-c", "from kernelwright.cli.main import main; main()", "suite", "eval",
        *map(str, problems), str(cands),
        "--name", name, "--out", str(out_root), "--store", str(store), "--json", *only, *extra,
    ]  # fmt: skip
    t0 = time.monotonic()
    started = time.time()
    log = (Path(os.environ["OUT"]) if os.environ.get("OUT") else corpus) / "corpus_suite.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=time_limit)
        except subprocess.TimeoutExpired:
            # stopped as a user's Ctrl-C stops it: what finished is in the records and the store
            os.killpg(proc.pid, signal.SIGINT)
            try:
                stdout, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, _ = proc.communicate()
    wall = time.monotonic() - t0
    ended = time.time()
    suite_json: dict | None = None
    for line in (stdout or "").splitlines()[::-1]:
        try:
            suite_json = json.loads(line)
            break
        except ValueError:
            continue
    summary = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": _device(),
        "command": "kernelwright suite eval ... " + " ".join(extra),
        "problems_asked": len(chosen),
        "exit_code": proc.returncode,
        "process_wall_s": round(wall, 1),
        "stopped_at_time_limit": bool(time_limit and wall >= time_limit),
        # the suite's own wall ends as its process does: its window, for the GPUs' busy share
        **summarise(_records(out_root, since=started), suite_json, ended - float((suite_json or {}).get("wall_s", 0))),
    }
    dest = Path(os.environ["OUT"]) if os.environ.get("OUT") else corpus
    (dest / "corpus_rows.json").write_text(json.dumps(rows(_records(out_root, since=started)), indent=1, default=str))
    _write(summary, dest)
    return 0 if proc.returncode in (0, 1) else proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unpack")
    u.add_argument("json", type=Path)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--kernelbench", type=Path)
    u.add_argument("--levels", default="")
    r = sub.add_parser("run")
    r.add_argument("corpus", type=Path)
    r.add_argument("--levels", default="1")
    r.add_argument("--limit", type=int)
    r.add_argument("--per-level", type=int, help="the first N problems of each level")
    r.add_argument("--name", default="corpus")
    r.add_argument("--time-limit", type=float, help="stop the suite after this many seconds (as Ctrl-C does)")
    s = sub.add_parser("summary")
    s.add_argument("corpus", type=Path)
    s.add_argument("--name", default="corpus")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # options passed on to `suite eval`
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.cmd == "unpack":
        levels = [v for v in args.levels.split(",") if v]
        return 0 if unpack(args.json, args.out, args.kernelbench, levels) else 2
    if args.cmd == "run":
        levels = [v for v in args.levels.split(",") if v]
        return run(args.corpus, levels, args.limit, args.name, extra, args.time_limit, per_level=args.per_level)
    summary = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        **summarise(_records(args.corpus / "runs" / args.name), None),
    }
    _write(summary, args.corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
