"""Scale-out: evaluations per minute on 1 GPU and on N GPUs of one machine, over a fixed set of
recorded candidates (no model calls), and the wall time of a forge round with K candidates.

    PYTHONPATH=src python3 benchmarks/scale_out.py [--device cuda] [--gpus 0,1] [--repeat 2] [--k 4]

Steps, in this order, in one run:
1. the task set: every candidate of the bundled swish example (the replayed run's three rounds on
   CUDA: incorrect, scalar, float4; the loop fixtures' three on the CPU) against the problem at
   four sizes, `--repeat` times: a fixed list, the same in every pass;
2. builds warmed: every distinct candidate is built once (`BuildPool`), so no pass pays a compile;
3. 1-GPU pass: `LocalExecutor` with the first GPU only; one untimed warm-up task, then the whole
   set submitted at once; evaluations per minute = tasks / wall time of the batch;
4. N-GPU pass: the same with every GPU of `--gpus`;
5. scaling: throughput ratio and efficiency (ratio / N); per-candidate timings: each passed task's
   candidate median in the N-GPU pass against the 1-GPU pass, "agree" when the two [p10, p90]
   bands overlap;
6. rounds: the forge loop with a scripted Coder and Judge (in-process, instant, no network) on
   the N GPUs, `--rounds` rounds with K=1 and with K=`--k` candidates; mean wall time per round.

Prints a markdown table, and writes it to `$OUT/scale_out.md` (and the raw figures to
`$OUT/scale_out.json`) when `$OUT` (or `--out`) is set. Runs on the CPU too (`--device cpu
--gpus 0,1`: fake GPUs sharing the CPU's cores, for checking the code path, not for figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kernelwright.core.config import EvalConfig, LoopConfig  # noqa: E402
from kernelwright.core.record import Status  # noqa: E402
from kernelwright.engine.config_resolution import resolve_config  # noqa: E402
from kernelwright.engine.extensions.prebuild import BuildPool  # noqa: E402
from kernelwright.executors.evaluator import ExecutorEvaluator  # noqa: E402
from kernelwright.executors.interface import EvalTask  # noqa: E402
from kernelwright.executors.local import LocalExecutor  # noqa: E402
from kernelwright.executors.placement import detect_gpus, parse_gpus, plan_cores  # noqa: E402
from kernelwright.loop.forge import Forge  # noqa: E402
from kernelwright.models.chat import Attempt, Completion, Usage  # noqa: E402
from kernelwright.suites.accounting import account  # noqa: E402

SIZES = {
    "cuda": [(4096, 4096), (8192, 4096), (16384, 4096), (8192, 8192)],
    "cpu": [(256, 1024), (512, 1024), (1024, 2048), (2048, 1024)],
}


def candidate_files(device: str) -> list[Path]:
    if device == "cuda":
        replay = ROOT / "examples" / "cuda_swish" / "replay"
        return sorted(replay.glob("*/candidate.py"))
    loop = ROOT / "tests" / "fixtures" / "loop"
    return [loop / "cpp_swish_wrong.py", loop / "cpp_swish_rowwise.py", loop / "cpp_swish_fused.py"]


def problem_files(device: str, folder: Path) -> list[Path]:
    """The example problem at each size (its `batch = ...` and `features = ...` lines rewritten)."""
    src = (ROOT / "examples" / ("cuda_swish" if device == "cuda" else "cpu_swish") / "problem.py").read_text()
    out = []
    for b, f in sorted(SIZES[device], key=lambda bf: -bf[0] * bf[1]):
        lines = [
            f"batch = {b}" if l.startswith("batch = ") else f"features = {f}" if l.startswith("features = ") else l
            for l in src.splitlines()
        ]
        path = folder / f"swish_{b}x{f}.py"
        path.write_text("\n".join(lines) + "\n")
        out.append(path)
    return out


def task_set(problems: list[Path], candidates: list[Path], repeat: int) -> list[EvalTask]:
    """Largest problems first in each repetition, so that a pass ends on short tasks (a smaller
    tail where one GPU has finished and the other has not)."""
    return [
        EvalTask(
            key=f"{p.stem}/{c.parent.name if c.name == 'candidate.py' else c.stem}#{r}",
            problem=p,
            candidate_text=c.read_text(),
        )
        for r in range(repeat)
        for p in problems
        for c in candidates
    ]


def warm_builds(config: EvalConfig, problem: Path, candidates: list[Path]) -> float:
    t0 = time.monotonic()
    with BuildPool(max_workers=min(4, len(candidates)), config=config) as pool:
        results = [f.result() for f in [pool.submit(problem, c.read_text()) for c in candidates]]
    for c, r in zip(candidates, results, strict=True):
        if not r.ok:
            print(f"  note: prebuild of {c} did not build: {r.error}", file=sys.stderr)
    return time.monotonic() - t0


def run_pass(config: EvalConfig, gpus: list[str], tasks: list[EvalTask], cores_per_gpu: int) -> dict:
    """All tasks at once on `gpus`: wall time of the batch (after one untimed warm-up task per GPU)."""
    with LocalExecutor(config, gpus=gpus, build_workers=0, cores_per_gpu=cores_per_gpu) as ex:
        warm = [ex.submit(replace(tasks[i % len(tasks)], key=f"warm-up/{i}")) for i in range(len(gpus))]
        for f in warm:
            f.result()
        t0, started_at = time.monotonic(), time.time()
        futs = [ex.submit(t) for t in tasks]
        results = {t.key: f.result() for t, f in zip(tasks, futs, strict=True)}
        wall = time.monotonic() - t0
        plan = ex.plan.describe()
    per_gpu: dict[str, int] = {}
    for r in results.values():
        g = str(r.metadata["executor"]["gpu"])
        per_gpu[g] = per_gpu.get(g, 0) + 1
    return {
        "gpus": gpus,
        "wall_s": wall,
        "evals_per_min": 60 * len(tasks) / wall,
        "per_gpu": per_gpu,
        "verdicts": {k: r.status.value for k, r in results.items()},
        "cores": plan,
        "timings": {k: _timing(r) for k, r in results.items() if r.status is Status.PASSED},
        # where the wall went: each stage's sum, each GPU's busy share (suites/accounting.py)
        "accounting": account([r.to_dict() for r in results.values()], wall, started_at),
    }


def _timing(r) -> dict:
    t = r.candidate_timing
    return {
        "median_ms": r.candidate_ms,
        "p10_ms": t.p10_ms if t else r.candidate_ms,
        "p90_ms": t.p90_ms if t else r.candidate_ms,
        "speedup": r.speedup,
    }


def agreement(one: dict, many: dict) -> dict:
    """Per task: do the two passes' [p10, p90] bands of the candidate's time overlap?"""
    rows = []
    for key, a in one["timings"].items():
        b = many["timings"].get(key)
        if b is None or not a["median_ms"] or not b["median_ms"]:
            continue
        overlap = a["p10_ms"] <= b["p90_ms"] and b["p10_ms"] <= a["p90_ms"]
        rows.append(
            {
                "key": key,
                "one_ms": a["median_ms"],
                "many_ms": b["median_ms"],
                "rel_diff": b["median_ms"] / a["median_ms"] - 1,
                "agree": overlap,
            }
        )
    return {
        "compared": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "max_abs_rel_diff": max((abs(r["rel_diff"]) for r in rows), default=None),
        "rows": rows,
    }


# ---- K candidates per round, with scripted models ------------------------------------------


class ScriptedModel:
    """An in-process Coder or Judge: answers at once from a fixed list, round-robin (no network)."""

    def __init__(self, name: str, answers: list[str]):
        self.name, self.answers, self.calls = name, answers, 0

    def complete(self, messages) -> Completion:
        text = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return Completion(text=text, usage=Usage(), model=self.name, attempts=[Attempt(1, True)], cost_usd=0.0)


JUDGE = json.dumps(
    {
        "bottleneck": "memory bound",
        "optimisation": "vectorise",
        "expected_speedup": 1.1,
        "critical_issue": "wrong output",
        "why_it_matters": "fails the check",
        "minimal_fix_hint": "add the bias",
    }
)


def round_times(
    config: EvalConfig,
    gpus: list[str],
    problem: Path,
    candidates: list[Path],
    k: int,
    rounds: int,
    backend: str,
    cores_per_gpu: int,
) -> dict:
    answers = [f"```python\n{c.read_text()}```\n" for c in candidates]
    coder, judge = ScriptedModel("scripted-coder", answers), ScriptedModel("scripted-judge", [f"```json\n{JUDGE}\n```"])
    ex = LocalExecutor(config, gpus=gpus, build_workers=0, cores_per_gpu=cores_per_gpu)
    ex.submit(EvalTask(key="warm-up", problem=problem, candidate_text=candidates[-1].read_text())).result()
    loop = LoopConfig(rounds=rounds, candidates=k, backend=backend)  # type: ignore[arg-type]
    state = Forge(problem, coder, judge, ExecutorEvaluator(ex), loop, device=config.device).run()  # closes ex
    walls = [r.wall_s for r in state.rounds]
    return {
        "k": k,
        "rounds": len(walls),
        "mean_round_s": statistics.mean(walls),
        "round_s": walls,
        "candidates_per_min": 60 * k * len(walls) / sum(walls),
    }


# ---- report ----------------------------------------------------------------------------------


def report(res: dict) -> str:
    one, many, agree = res["one"], res["many"], res["agreement"]
    n = len(many["gpus"])
    lines = [
        f"## Scale-out: {res['device_name']} x{n}, {res['host']}, {res['date']}",
        "",
        f"{res['tasks']} evaluations per pass ({res['problems']} problem sizes x {res['candidates']} recorded "
        f"candidates x {res['repeat']}), builds warmed first ({res['warm_builds_s']:.1f} s); cores: {many['cores']}.",
        "",
        "| pass | GPUs | wall (s) | per evaluation (s) | evaluations/min | speedup | efficiency | GPU busy | per GPU |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| 1 GPU | {','.join(map(str, one['gpus']))} | {one['wall_s']:.1f} | {_each(one)} | "
        f"{one['evals_per_min']:.1f} | 1.00x | 100% | {_busy(one)} | {_per_gpu(one)} |",
        f"| {n} GPUs | {','.join(map(str, many['gpus']))} | {many['wall_s']:.1f} | {_each(many)} | "
        f"{many['evals_per_min']:.1f} | {res['speedup']:.2f}x | {res['efficiency']:.0%} | {_busy(many)} | "
        f"{_per_gpu(many)} |",
        "",
        f"Stage sums (s), {n}-GPU pass: {_stages(many)}; 1-GPU pass: {_stages(one)}.",
        "",
        f"Per-candidate timings, {n}-GPU pass against the 1-GPU pass: {agree['agree']} of {agree['compared']} "
        f"passed tasks agree (their [p10, p90] bands overlap); largest difference of medians "
        f"{_pct(agree['max_abs_rel_diff'])}. Verdicts identical in both passes: {res['same_verdicts']}.",
    ]
    if res.get("rounds"):
        k1, kk = res["rounds"]
        lines += [
            "",
            f"| forge round ({n} GPUs, scripted models) | rounds | mean wall per round (s) | candidates/min |",
            "|---|---|---|---|",
        ]
        for r in (k1, kk):
            lines.append(f"| K={r['k']} | {r['rounds']} | {r['mean_round_s']:.2f} | {r['candidates_per_min']:.1f} |")
        lines += [
            "",
            f"K={kk['k']} costs {kk['mean_round_s'] / k1['mean_round_s']:.2f}x the wall time of K=1 per round "
            f"for {kk['k']}x the candidates.",
        ]
    return "\n".join(lines) + "\n"


def _per_gpu(p: dict) -> str:
    return ", ".join(f"{g}: {c}" for g, c in sorted(p["per_gpu"].items()))


def _each(p: dict) -> str:
    per = p["accounting"]["wall_per_problem_s"]
    return "-" if per is None else f"{per:.2f}"


def _busy(p: dict) -> str:
    """The mean busy share over the pass's GPUs (the share of the wall some evaluation used it)."""
    return _pct(p["accounting"]["gpu_busy"]["share"])


def _stages(p: dict) -> str:
    sums = p["accounting"]["stage_sum_s"]
    return ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in sums.items() if v)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def device_name(device: str) -> str:
    if device != "cuda":
        return f"CPU ({platform.machine()}, {os.cpu_count()} cores; fake GPUs)"
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "CUDA GPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpus", default=None, help="GPUs of the N-GPU pass, e.g. 0,1 (default: every visible GPU)")
    ap.add_argument("--repeat", type=int, default=2, help="times the candidate set is repeated in each pass")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--k", type=int, default=4, help="candidates per round in the round comparison (0: skip it)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores-per-gpu", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for scale_out.md/json (default: $OUT)")
    args = ap.parse_args()

    gpus = parse_gpus(args.gpus) or detect_gpus()
    if not gpus:
        sys.exit("error: no GPU visible; pass --gpus 0,1 (with --device cpu for fake GPUs)")
    config = resolve_config(EvalConfig(device=args.device, trials=args.trials))
    folder = Path(tempfile.mkdtemp(prefix="kw-scale-out-"))
    problems = problem_files(args.device, folder)
    candidates = candidate_files(args.device)
    tasks = task_set(problems, candidates, args.repeat)
    print(f"{len(tasks)} tasks; warming builds…", file=sys.stderr)
    warm_s = warm_builds(config, problems[0], candidates)
    print(f"1-GPU pass on {gpus[0]}…", file=sys.stderr)
    one = run_pass(config, gpus[:1], tasks, args.cores_per_gpu)
    print(f"{len(gpus)}-GPU pass on {','.join(gpus)}…", file=sys.stderr)
    print(f"  1 GPU: {one['evals_per_min']:.2f} evaluations/min", file=sys.stderr)
    many = run_pass(config, gpus, tasks, args.cores_per_gpu)
    print(
        f"  {len(gpus)} GPUs: {many['evals_per_min']:.2f} evaluations/min "
        f"({many['evals_per_min'] / one['evals_per_min']:.2f}x)",
        file=sys.stderr,
    )
    res = {
        "device": args.device,
        "device_name": device_name(args.device),
        "host": socket.gethostname(),
        "date": date.today().isoformat(),
        "tasks": len(tasks),
        "problems": len(problems),
        "candidates": len(candidates),
        "repeat": args.repeat,
        "warm_builds_s": warm_s,
        "one": one,
        "many": many,
        "speedup": many["evals_per_min"] / one["evals_per_min"],
        "same_verdicts": one["verdicts"] == many["verdicts"],
        "agreement": agreement(one, many),
        "plan": plan_cores(len(gpus), args.cores_per_gpu).describe(),
    }
    res["efficiency"] = res["speedup"] / len(gpus)
    if args.k > 1:
        backend = "cuda" if args.device == "cuda" else "cpp"
        print(f"rounds: K=1 and K={args.k}…", file=sys.stderr)
        res["rounds"] = [
            round_times(config, gpus, problems[1], candidates, k, args.rounds, backend, args.cores_per_gpu)
            for k in (1, args.k)
        ]
    text = report(res)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "scale_out.md").write_text(text)
        (out / "scale_out.json").write_text(json.dumps(res, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
