import json, subprocess, sys, os
p = subprocess.run([sys.executable, "-m", "kernelwright.cli.main", "eval", "examples/mamba2_ssd/problem_y.py",
                    "examples/mamba2_ssd/candidate_y.py", "--device", "cuda", "--json"], capture_output=True, text=True, timeout=280)
try:
    d = json.loads(p.stdout)
except ValueError:
    print("no record", p.stderr[-800:]); sys.exit(0)
print(d["status"], d.get("speedup"), sorted((d["metadata"].get("guards") or {}).get("flags", {})))
print(json.dumps(d["metadata"].get("shapes"), indent=1)[:3000])
