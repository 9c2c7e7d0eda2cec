# One device call: the judge-clock figures of the bundled examples, then the clock attacks on the GPU.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KW_TEST_CACHE=/tmp/kwc
. scripts/install_bwrap_deb.sh > $OUT/bwrap.log 2>&1
for p in "examples/cuda_swish/problem.py examples/cuda_swish/candidate.py" "examples/mamba2_ssd/problem_y.py examples/mamba2_ssd/candidate_y.py" "examples/mamba2_ssd/problem_state.py examples/mamba2_ssd/candidate_state.py"; do
  n=$(basename $(dirname ${p%% *}))_$(basename ${p%% *} .py)
  for i in 1 2; do timeout 200 python3 -m kernelwright.cli.main eval $p --device cuda --json > $OUT/${n}_$i.json 2>$OUT/${n}_$i.err; done
done
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/*_[12].json")):
    try: d=json.load(open(f))
    except Exception as e: print(f, "no record", e); continue
    t=d["metadata"].get("timing") or {}
    print(os.path.basename(f), d["status"], round(d["speedup"] or 0,3), d["candidate_ms"], d["reference_ms"], t.get("calls_per_window"), sorted((d["metadata"].get("guards") or {}).get("flags",{})))
    for w in t.get("windows", [])[:2]: print("   ", w)
P
timeout 240 python3 -m pytest -m gpu tests/test_clock_attacks.py -p no:cacheprovider -q > $OUT/clock_gpu.log 2>&1; echo "clock tests rc=$?"; grep -E "passed|failed|Error" $OUT/clock_gpu.log | tail -8 | cut -c1-300
