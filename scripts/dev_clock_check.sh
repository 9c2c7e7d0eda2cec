#!/usr/bin/env bash
# The device clock's honest figures, window by window (scripts/clock_breakdown.py), then the copy in
# against its calibrations (benchmarks/handoff_anatomy.py --copies; KW_COPIES=0 leaves it out). One
# device call, carrying .deb (KW_MORE: more pairs, PROBLEM@CANDIDATE; KW_REPS: "1 2" runs each twice):
#   bash scripts/dev_clock_check.sh
OUT=${OUT:-/tmp/o}; export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
for p in "tests/fixtures/problems/swish.py tests/clock_attacks/honest.py" "examples/cuda_swish/problem.py examples/cuda_swish/candidate.py" ${KW_MORE:-}; do
  for rep in ${KW_REPS:-1}; do
    n=$(echo "$p" | md5sum | cut -c1-6)-$rep
    echo "== $p ($rep)"
    timeout 120 python3 -m kernelwright.cli.main eval ${p/@/ } --device cuda --json --no-server > $OUT/e-$n.json 2>$OUT/e-$n.err
    python3 scripts/clock_breakdown.py $OUT/e-$n.json || tail -3 $OUT/e-$n.err
  done
done
[ "${KW_COPIES-1}" = 1 ] && timeout 120 python3 benchmarks/handoff_anatomy.py --copies
