"""The clock-attack suite's honest control (the reference's own code for swish) evaluated N times on
the GPU, alone, then N times beside a process that keeps the GPU busy with matmuls: speed-up, whether
the record trusts it, and its timing flag. `python3 scripts/dev_honest.py [N] [--alone]` (PYTHONPATH=src;
--alone: no busy process of its own, e.g. several of these side by side, as a parallel gpu suite runs)."""

import subprocess
import sys
import tempfile
import time

sys.path.insert(0, "tests")
import test_clock_attacks as t  # noqa: E402

from conftest import make_cpu_config  # noqa: E402

HOG = (
    "import torch,time\na=torch.randn(4096,4096,device='cuda')\nt=time.time()\n"
    "while time.time()-t<120:\n    a@a; torch.cuda.synchronize()\n"
)


def once(label: str) -> None:
    t0 = time.time()
    r = t.run(t._config(make_cpu_config(tempfile.mkdtemp()), device="cuda"), "honest.py")
    unstable = r.flags().get("timing_unstable", "")
    took = time.time() - t0
    turn = r.metadata.get("gpu_turn") or {}
    procs = r.metadata.get("gpu_processes") or {}  # NVML's busy processes during the windows (evidence)
    waited = f"turn held={turn.get('held')} waited {turn.get('waited_s')} s"
    waited += f" nvml busy={procs.get('busy')} {procs.get('processes') or procs.get('unavailable', '')}"
    print(
        f"{label}: {r.status.value} {r.speedup} trusted={r.speedup_trusted} {took:.0f}s {waited} {unstable[:300]}",
        flush=True,
    )


n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2
for i in range(n):
    once(f"alone {i}")
if "--alone" in sys.argv:
    sys.exit(0)
hog = subprocess.Popen([sys.executable, "-c", HOG])
time.sleep(5)
try:
    for i in range(n):
        once(f"beside a matmul loop {i}")
finally:
    hog.kill()
