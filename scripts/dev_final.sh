#!/usr/bin/env bash
# One device call at a session's end: the gpu tests named in $KW_RERUN alone (after a run of the
# whole suite side by side), then the timer agreement over the pairs an earlier run timed (carry
# .agree, .corpus, .deb): independent timers, kernelwright's suite on every GPU then on one, each
# with a fresh build cache (the same runs give the one- and two-GPU suite figures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-final}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >/dev/null 2>&1
if [ -n "${KW_RERUN:-}" ]; then
    timeout "${KW_RERUN_LIMIT:-150}" python3 -m pytest -m gpu -n 2 -p no:cacheprovider -q $KW_RERUN >"$OUT/rerun.log" 2>&1
    echo "rerun: exit $? ($(tail -n 1 "$OUT/rerun.log"))"
fi
KW_PAIRS_FROM=.agree/independent.jsonl KW_SEL= KW_LEVELS=1,2 KW_GPUS=2 KW_BUILD_JOBS=24 \
    KW_IND_LIMIT=${KW_IND_LIMIT:-90} KW_KW_LIMIT=${KW_KW_LIMIT:-100} KW_NAMES=${KW_NAMES-"g2fresh g1fresh"} \
    OUT=$OUT bash scripts/dev_agreement.sh
