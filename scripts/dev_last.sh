#!/usr/bin/env bash
# One device call on four GPUs, at a session's end (carry .deb .corpus .agree): the timer agreement
# over the pairs in $KW_PAIRS_FROM (independent timers, then kernelwright's suite, on GPUs 0 and 1)
# beside the clock's gpu tests on GPU 2 and the stuck-kernel benchmark on GPU 3.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-last}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
( CUDA_VISIBLE_DEVICES=2 KW_TEST_CACHE=/tmp/kwc2 timeout "${KW_TESTS_LIMIT:-230}" python3 -m pytest -m gpu -n 4 --dist load \
    -p no:cacheprovider -q tests/test_clock_attacks.py tests/test_device_clock.py >"$OUT/clock_tests.log" 2>&1
  echo "clock tests: exit $? ($(tail -n 1 "$OUT/clock_tests.log"))" ) &
( CUDA_VISIBLE_DEVICES=3 OUT="$OUT" timeout "${KW_STUCK_LIMIT:-150}" python3 benchmarks/stuck_kernel.py --device cuda >"$OUT/stuck.log" 2>&1
  echo "stuck: exit $?"; cat "$OUT/stuck.log" | grep '^{' ) &
CUDA_VISIBLE_DEVICES=0,1 KW_PAIRS_FROM=${KW_PAIRS_FROM:-.agree/passed.jsonl} KW_SEL= KW_LEVELS=1,2 KW_GPUS=2 KW_BUILD_JOBS=24 \
    KW_IND_LIMIT=${KW_IND_LIMIT:-80} KW_KW_LIMIT=${KW_KW_LIMIT:-110} KW_NAMES=${KW_NAMES-"g2fresh"} \
    OUT=$OUT/agree bash scripts/dev_agreement.sh
wait
