export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KW_TEST_CACHE=/tmp/kwc
. scripts/install_bwrap_deb.sh > $OUT/bwrap.log 2>&1
for i in 1 2; do python3 -m kernelwright.cli.main eval examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --device cuda --json > $OUT/swish_new_$i.json 2>$OUT/swish_new_$i.err; done
python3 - <<'P'
import json,os
for i in (1,2):
    d=json.load(open(os.environ["OUT"]+f"/swish_new_{i}.json"))
    print(d["status"], d["speedup"], d["candidate_ms"], d["reference_ms"])
    for w in d["metadata"]["timing"]["windows"]: print(w)
    print(d["metadata"]["timing"]["estimate_ms"], d["metadata"]["timing"]["calls_per_window"])
P
timeout 200 python3 -m pytest -m gpu tests/test_clock_attacks.py -p no:cacheprovider -q > $OUT/clock_gpu.log 2>&1; echo "clock tests rc=$?"; tail -15 $OUT/clock_gpu.log | cut -c1-300
timeout 280 python3 benchmarks/clock_side_by_side.py --old-src .old/src --new-src src --device cuda --repeats 1 --only mamba2_y,mamba2_state --out $OUT/side_mamba.jsonl > $OUT/side_mamba.log 2>&1; echo "mamba rc=$?"; tail -6 $OUT/side_mamba.log
