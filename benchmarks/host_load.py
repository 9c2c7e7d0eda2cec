"""Does the machine's CPU load move the speed-up of record, and do lower-priority builds keep it off?

Level 3's models launch hundreds of small kernels a call: the host paces them. Inside a suite
(other evaluations' builds and checks on the same machine), kernelwright read some of them 1.3-1.9x
slower than `do_bench` read each side alone afterwards (docs/PERFORMANCE.md). This benchmark asks
whether CPU load is the cause: for each pair, `kernelwright eval --no-server` and the reference
alone under `do_bench` (benchmarks/timer_agreement.py's `time_side`, in a process of its own), in
three conditions:

- `quiet`: nothing else on the machine;
- `load`: N compilers (`g++ -fsyntax-only` of torch's extension header, the suite's build load) at
  the evaluation's priority;
- `load_nice`: the same compilers at nice 19, as kernelwright's builds would run under a lower priority.

    python3 benchmarks/host_load.py CORPUS --pairs level3/29_task,level3/12_task --burners 24 --out DIR

Writes DIR/host_load.jsonl (a row per pair and condition) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _burner_cmd() -> list[str]:
    import torch.utils.cpp_extension as ce

    inc = " ".join(f"-I{p}" for p in ce.include_paths())
    py = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    compile_once = f"echo '#include <torch/extension.h>' | g++ -std=c++17 -O2 -fsyntax-only -x c++ {inc} -I{py} -"
    return ["bash", "-c", f"while true; do {compile_once} >/dev/null 2>&1; done"]


def _burners(n: int, nice: int) -> list[subprocess.Popen]:
    cmd = _burner_cmd()
    return [
        subprocess.Popen(cmd, preexec_fn=(lambda: os.nice(nice)) if nice else None, start_new_session=True)
        for _ in range(n)
    ]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def _loadavg() -> float:
    return os.getloadavg()[0]


def _eval(problem: Path, cand: Path) -> dict:
    cmd = [sys.executable, "-m", "kernelwright.cli.main", "eval", str(problem), str(cand), "--json", "--no-server"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        rec = json.loads(p.stdout)
    except ValueError:
        return {"status": f"no record (exit {p.returncode}): {p.stderr.strip()[-200:]}"}
    t = (rec.get("metadata") or {}).get("timing") or {}
    return {
        "status": rec.get("status"),
        "speedup": rec.get("speedup"),
        "reference_ms": rec.get("reference_ms"),
        "candidate_ms": rec.get("candidate_ms"),
        "band": t.get("band"),
        "launch": t.get("launch"),
        "flags": sorted((((rec.get("metadata") or {}).get("guards") or {}).get("flags") or {}).keys()),
    }


def _do_bench_reference(problem: Path) -> dict:
    code = (
        "import json, sys; from pathlib import Path; from benchmarks.timer_agreement import time_side; "
        "p = Path(sys.argv[1]); print(json.dumps(time_side(p, p, 'Model', 'cuda')))"
    )
    cmd = [sys.executable, "-c", code, str(problem)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": p.stderr.strip()[-200:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--pairs", required=True, help="levelN/<stem>,... (problems/ and candidates/ of the corpus)")
    ap.add_argument("--burners", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4))
    ap.add_argument("--conditions", default="quiet,load,load_nice")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dest = a.out / "host_load.jsonl"
    for cond in a.conditions.split(","):
        procs = [] if cond == "quiet" else _burners(a.burners, 19 if cond == "load_nice" else 0)
        try:
            if procs:
                time.sleep(5.0)  # the compilers past their start
            for pair in a.pairs.split(","):
                problem = a.corpus / "problems" / f"{pair}.py"
                cand = a.corpus / "candidates" / f"{pair}.py"
                t0 = time.time()
                row = {"pair": pair, "condition": cond, "burners": len(procs), "loadavg_before": _loadavg()}
                row["kernelwright"] = _eval(problem, cand)
                row["do_bench_reference"] = _do_bench_reference(problem)
                row["loadavg_after"], row["seconds"] = _loadavg(), round(time.time() - t0, 1)
                with dest.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                kw, ind = row["kernelwright"], row["do_bench_reference"]
                print(
                    f"{pair} {cond:9s} kw {kw.get('status')} {kw.get('speedup') or 0:.3f}x "
                    f"ref {kw.get('reference_ms') or 0:.4g} ms cand {kw.get('candidate_ms') or 0:.4g} ms "
                    f"band {kw.get('band')} | do_bench ref {ind.get('do_bench_ms') or 0:.4g} ms "
                    f"b2b {ind.get('b2b_ms') or 0:.4g} | load {row['loadavg_before']:.1f}-{row['loadavg_after']:.1f}",
                    flush=True,
                )
        finally:
            _stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
