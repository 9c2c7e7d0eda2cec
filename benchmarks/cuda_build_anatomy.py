"""Where the cold build of a `load_inline` CUDA candidate spends its time, compile by compile.

    PYTHONPATH=src python3 benchmarks/cuda_build_anatomy.py [--candidate FILE] [--out results.json]

Writes the candidate's ninja file exactly as torch would (its `load_inline` call, with the build
step stopped before it runs), takes the compile commands from `ninja -t commands`, and times:
- `main.cpp` (torch's generated bindings, `<torch/extension.h>`) as torch compiles it;
- `cuda.cu` as torch compiles it, with `nvcc --time` (per-phase split: preprocessing, the
  device front end `cicc`, `ptxas`, the host front end `cudafe++`, the host `gcc` pass);
- `cuda.cu` with the candidate's `<torch/extension.h>` includes replaced by `<torch/types.h>`;
- `cuda.cu` with the engine's lean headers (`engine/child/lean_headers.py`);
- the same two with `-Xcompiler -O1` (host pass at -O1);
- a `.cu` file that holds only one header each (`<torch/extension.h>`, `<torch/types.h>`,
  `<ATen/core/Tensor.h>`, `<cuda_runtime.h>`) under the same flags: the cost of parsing it.
Variants run `--jobs` at a time (each compile is single-threaded).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


class _Stop(Exception):
    pass


def write_ninja(candidate: Path, ext_dir: Path) -> Path:
    """Run the candidate's load_inline with the ninja run replaced by a stop; return its build dir."""
    code = (
        "import runpy, sys, torch.utils.cpp_extension as c\n"
        "class Stop(Exception): pass\n"
        "def stop(*a, **k): raise Stop()\n"
        "c._run_ninja_build = stop\n"
        "import os\n"
        "if c.CUDA_HOME is None and os.environ.get('CUDA_HOME'): c.CUDA_HOME = os.environ['CUDA_HOME']  # a CPU torch\n"
        "try:\n"
        f"    runpy.run_path({str(candidate)!r})\n"
        "except Stop:\n"
        "    sys.exit(0)\n"
        "sys.exit('the candidate did not reach a ninja build')\n"
    )
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    found = sorted(ext_dir.rglob("build.ninja"))
    if not found:
        raise SystemExit("no build.ninja written")
    return found[0].parent


def compile_commands(build_dir: Path) -> dict[str, str]:
    out = subprocess.run(["ninja", "-t", "commands"], cwd=build_dir, capture_output=True, text=True, check=True).stdout
    cmds = {}
    for line in out.splitlines():
        if " -c " in line and "cuda.cu" in line:
            cmds["cuda"] = line
        elif " -c " in line and "main.cpp" in line:
            cmds["main"] = line
    return cmds


def timed(cmd: str, cwd: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "ok": p.returncode == 0, "err": (p.stderr or p.stdout)[-1500:] if p.returncode else ""}


def nvcc_phases(csv_path: Path) -> dict[str, float]:
    """nvcc --time CSV -> phase -> seconds (summed over repeated phases)."""
    phases: dict[str, float] = {}
    if not csv_path.exists():
        return phases
    for row in csv.reader(io.StringIO(csv_path.read_text())):
        if len(row) < 5 or not row[-1].strip().replace(".", "", 1).isdigit():
            continue
        name = row[0].strip()
        phases[name] = phases.get(name, 0.0) + float(row[-1]) / 1e3  # ms -> s
    return phases


def variant(cmd: str, src_in: str, src_out: str, extra: str = "", time_csv: str = "") -> str:
    cmd = cmd.replace(src_in, src_out)
    cmd = re.sub(r"-o \S+\.o", f"-o {src_out}.o", cmd)
    cmd = re.sub(r"--dependency-output \S+", f"--dependency-output {src_out}.d", cmd)
    if time_csv:
        extra += f" --time {time_csv}"
    return cmd.replace(" -c ", f" {extra} -c ", 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidate", type=Path, default=ROOT / "examples" / "cuda_swish" / "candidate.py")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    ext_dir = Path(tempfile.mkdtemp(prefix="kw-anatomy-"))
    bdir = write_ninja(args.candidate.resolve(), ext_dir)
    cmds = compile_commands(bdir)
    if "cuda" not in cmds:
        raise SystemExit("the candidate has no cuda_sources")
    cu = (bdir / "cuda.cu").read_text()
    light = re.sub(r"#include\s*<torch/extension\.h>", "#include <torch/types.h>", cu)
    (bdir / "light.cu").write_text(light)
    import torch.utils.cpp_extension as cpp_ext

    from kernelwright.engine.child.lean_headers import lean_cuda_sources

    lean = lean_cuda_sources([cu], Path(cpp_ext._TORCH_PATH) / "include")
    if lean is None:
        raise SystemExit("lean headers do not apply to this candidate")
    (bdir / "lean.cu").write_text("\n".join(lean.cuda_sources))
    (bdir / "lean_o1.cu").write_text("\n".join(lean.cuda_sources))
    headers = {
        "h_extension": "torch/extension.h",
        "h_types": "torch/types.h",
        "h_tensor": "ATen/core/Tensor.h",
        "h_cuda_runtime": "cuda_runtime.h",
        "h_cudacontext": "ATen/cuda/CUDAContext.h",
        "h_dispatch": "ATen/Dispatch.h",
    }
    for key, h in headers.items():
        (bdir / f"{key}.cu").write_text(f"#include <{h}>\n__global__ void k(float* x) {{ x[threadIdx.x] = 1.f; }}\n")

    c = cmds["cuda"]
    jobs = {
        "cuda.cu as torch builds it": variant(c, "cuda.cu", "v_asis.cu", time_csv="t_asis.csv"),
        "cuda.cu, <torch/types.h> for <torch/extension.h>": variant(c, "cuda.cu", "light.cu", time_csv="t_light.csv"),
        "cuda.cu, host -O1": variant(c, "cuda.cu", "v_o1.cu", "-Xcompiler -O1", time_csv="t_o1.csv"),
        "cuda.cu, <torch/types.h>, host -O1": variant(
            c, "cuda.cu", "light_o1.cu", "-Xcompiler -O1", time_csv="t_light_o1.csv"
        ),
        "cuda.cu, lean headers (engine)": variant(c, "cuda.cu", "lean.cu", time_csv="t_lean.csv"),
        "cuda.cu, lean headers, host -O1": variant(
            c, "cuda.cu", "lean_o1.cu", "-Xcompiler -O1", time_csv="t_lean_o1.csv"
        ),
    }
    (bdir / "v_asis.cu").write_text(cu)
    (bdir / "v_o1.cu").write_text(cu)
    (bdir / "light_o1.cu").write_text(light)
    for key, h in headers.items():
        jobs[f"only <{h}>"] = variant(c, "cuda.cu", f"{key}.cu")
    if "main" in cmds:
        jobs["main.cpp as torch builds it (no PCH)"] = cmds["main"]

    print(f"build dir {bdir}; {len(jobs)} compiles, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        futs = {k: pool.submit(timed, v, bdir) for k, v in jobs.items()}
        res = {k: f.result() for k, f in futs.items()}
    for k, csvname in (
        ("cuda.cu as torch builds it", "t_asis.csv"),
        ("cuda.cu, <torch/types.h> for <torch/extension.h>", "t_light.csv"),
        ("cuda.cu, host -O1", "t_o1.csv"),
        ("cuda.cu, <torch/types.h>, host -O1", "t_light_o1.csv"),
        ("cuda.cu, lean headers (engine)", "t_lean.csv"),
        ("cuda.cu, lean headers, host -O1", "t_lean_o1.csv"),
    ):
        res[k]["phases"] = nvcc_phases(bdir / csvname)
    for k, r in res.items():
        line = f"{r['wall_s']:7.1f} s  {'ok ' if r['ok'] else 'ERR'} {k}"
        if r.get("phases"):
            line += "\n           " + ", ".join(f"{p} {s:.1f}" for p, s in r["phases"].items())
        if r["err"]:
            line += "\n           " + r["err"][-400:].replace("\n", "\n           ")
        print(line)
    out = {"candidate": str(args.candidate), "cpu_count": os.cpu_count(), "commands": jobs, "results": res}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
