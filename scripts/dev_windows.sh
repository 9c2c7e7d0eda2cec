#!/usr/bin/env bash
# One device call: where a timing window's time goes, for the memory-bound CUDA example and the
# suite's fixtures (the judge's phases and the runner's own account, window by window), and the
# same candidates under the version before the judge's clock (--old-src, if given as $1).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KW_TEST_CACHE=/tmp/kwc
OUT=${OUT:-/tmp/kw-device-out}; mkdir -p "$OUT"
. scripts/install_bwrap_deb.sh >"$OUT/bwrap.log" 2>&1
OLD=${1:-}
run() {  # run NAME SRC PROBLEM CANDIDATE
  PYTHONPATH=$2 timeout 200 python3 -m kernelwright.cli.main eval "$3" "$4" --device cuda --json >"$OUT/$1.json" 2>"$OUT/$1.err"
}
for n in 1 2; do run swish_new_$n src examples/cuda_swish/problem.py examples/cuda_swish/candidate.py; done
[ -n "$OLD" ] && run swish_old_1 "$OLD" examples/cuda_swish/problem.py examples/cuda_swish/candidate.py
for f in 2_swish 4_row_softmax 5_small_matmul; do
  run suite_${f}_new src tests/fixtures/suite/level1/$f.py tests/fixtures/suite/candidates/$f.py
  [ -n "$OLD" ] && run suite_${f}_old "$OLD" tests/fixtures/suite/level1/$f.py tests/fixtures/suite/candidates/$f.py
done
python3 - <<'P'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "no record", e, open(f[:-5] + ".err").read()[-400:]); continue
    t = d["metadata"].get("timing") or {}
    st = d.get("stage_times") or {}
    print(os.path.basename(f), d["status"], round(d["speedup"] or 0, 3), d["candidate_ms"], d["reference_ms"],
          "calls/window", t.get("calls_per_window"), t.get("plan"), "flags", sorted((d["metadata"].get("guards") or {}).get("flags", {})),
          "stages", {k: round(v, 2) for k, v in st.items() if isinstance(v, (int, float))})
    print("   phases", t.get("judge_phases_s"))
    for w in t.get("windows", []): print("   ", w)
P
