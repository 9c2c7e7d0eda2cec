#!/usr/bin/env bash
# One device call on one or two GPUs (carry .deb .corpus .agree): the timer agreement over CUDA-L1's level 3
# (every pair, built) and the level 1-2 pairs that passed before (.agree/passed.jsonl), both timers
# in this one call: the independent ones on the first one or two GPUs, then kernelwright's suite runs $KW_NAMES
# (KW_AGREE_LEVELS: the levels kernelwright evaluates, 1,2,3; a name with g1: GPU 0 only; g2: GPUs 0 and 1; fresh: an empty build cache of its own).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-a3}
mkdir -p "$OUT/x"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >"$OUT/x/bwrap.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u +%FT%TZ; git log -1 --format=%h; } >"$OUT/x/machine.txt" 2>&1
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); NG=$((NG > 2 ? 2 : (NG < 1 ? 1 : NG)))
ind() {  # LIMIT_S then the pair selection
    local limit=$1; shift
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((NG - 1))) timeout "$((limit + 30))" python3 benchmarks/timer_agreement.py independent .corpus "$@" \
        --out "$OUT" --gpus "$NG" --build-jobs 24 --limit-s "$limit" --timeout 90 >>"$OUT/x/ind.log" 2>&1
    echo "independent $*: exit $? at $SECONDS s, $(wc -l <"$OUT/independent.jsonl") rows"
}
if [ -z "${KW_SKIP_IND:-}" ]; then
    [ "${KW_IND3_LIMIT:-150}" -gt 0 ] && ind "${KW_IND3_LIMIT:-150}" --levels 3
    if [ "${KW_IND12_LIMIT:-70}" -gt 0 ]; then
        ind "${KW_IND12_LIMIT:-70}" --levels 1,2 --pairs-from .agree/passed.jsonl
    else  # the rows an earlier call timed for those pairs (an H200 too)
        cat .agree/passed.jsonl >>"$OUT/independent.jsonl"
    fi
else
    cp "${KW_IND_FILE:-.agree/independent3.jsonl}" "$OUT/independent.jsonl"  # an earlier call's rows (same kind of GPU)
fi
for name in ${KW_NAMES-g2fresh g2}; do
    extra=()
    case "$name" in *g1*) extra+=(--gpus 0) ;; *g2*) extra+=(--gpus 0,1) ;; esac
    cache=/tmp/kw-agree-cache
    case "$name" in *fresh*) cache=/tmp/kw-agree-cache-$name ;; esac
    limit=${KW_KW_LIMIT:-150}
    case "$name" in *g1*) limit=${KW_G1_LIMIT:-$limit} ;; esac
    t0=$SECONDS
    export KW_SUITE_LIMIT=$((limit - 25))
    OUT=$OUT/x KERNELWRIGHT_CACHE=$cache timeout "$limit" python3 benchmarks/timer_agreement.py kernelwright .corpus \
        --levels "${KW_AGREE_LEVELS:-1,2,3}" --name "$name" --out "$OUT" --only-timed -- "${extra[@]}" >"$OUT/x/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s, $(wc -l <"$OUT/kw-$name.jsonl" 2>/dev/null) records"
    [ -f "$OUT/x/corpus_suite.json" ] && mv "$OUT/x/corpus_suite.json" "$OUT/suite-$name.json"
done
python3 benchmarks/timer_agreement.py report "$OUT" $(for n in ${KW_NAMES-g2fresh g2}; do echo --name "$n"; done) >"$OUT/x/report.log" 2>&1
[ -f "$OUT/agreement.md" ] && head -c 2500 "$OUT/agreement.md"
tar czf "$OUT/logs.tgz" -C "$OUT" x && rm -rf "$OUT/x"
ls "$OUT"
