#!/usr/bin/env bash
# Timer agreement on the device: the independent timers, then kernelwright's suite (and $KW_ALONE
# evals alone), over CUDA-L1's level-$KW_LEVELS pairs unpacked into .corpus (carry .corpus and .deb).
#   bash scripts/dev_agreement.sh            # independent + suite, then the report
#   KW_SKIP_IND=1 KW_NAMES="suite2" bash scripts/dev_agreement.sh   # kernelwright only (independent.jsonl carried in .agree)
#   KW_NAMES= KW_SEL= KW_LEVELS=1,2 KW_GPUS=2 KW_BUILD_JOBS=24 KW_IND_LIMIT=420 bash scripts/dev_agreement.sh
#       # independent timings only, with builds, over two GPUs (candidates pre-built 24 at a time)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-agree}
mkdir -p "$OUT/x"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >"$OUT/x/bwrap.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u +%FT%TZ; git log -1 --format=%h; } >"$OUT/x/machine.txt" 2>&1
LV=${KW_LEVELS:-1}
SEL=(--levels "$LV" ${KW_SEL---no-builds})
[ -n "${KW_PAIRS_FROM:-}" ] && SEL+=(--pairs-from "$KW_PAIRS_FROM")  # e.g. .agree/independent.jsonl: the pairs timed there
if [ -z "${KW_SKIP_IND:-}" ]; then
    timeout "$((${KW_IND_LIMIT:-250} + 60))" python3 benchmarks/timer_agreement.py independent .corpus "${SEL[@]}" --out "$OUT" \
        --gpus "${KW_GPUS:-1}" --build-jobs "${KW_BUILD_JOBS:-0}" --limit-s "${KW_IND_LIMIT:-250}" --timeout 90 >"$OUT/x/ind.log" 2>&1
    echo "independent: exit $? $(wc -l <"$OUT/independent.jsonl") pairs"
else
    cp .agree/independent.jsonl "$OUT/"
fi
# a run's name says how it runs: alone* (`eval` per pair), *g1* (`suite eval --gpus 0`), *g2*
# (`--gpus 0,1`; else every GPU), *fresh* (an empty build cache of its own; else the one the runs before it filled)
for name in ${KW_NAMES-suite1}; do
    extra=()
    case "$name" in *g1*) extra+=(--gpus 0) ;; *g2*) extra+=(--gpus 0,1) ;; esac
    cache=/tmp/kw-agree-cache
    case "$name" in *fresh*) cache=/tmp/kw-agree-cache-$name ;; esac
    t0=$SECONDS
    # the suite is stopped as Ctrl-C stops it 30 s before the hard limit, so its records and accounting stay
    export KW_SUITE_LIMIT=$((${KW_KW_LIMIT:-320} - 30))
    case "$name" in
    alone*) OUT=$OUT/x KERNELWRIGHT_CACHE=$cache timeout "${KW_KW_LIMIT:-320}" python3 benchmarks/timer_agreement.py kernelwright .corpus "${SEL[@]}" --alone --name "$name" --out "$OUT" --only-timed ${KW_ALONE_ARGS:-} >"$OUT/x/$name.log" 2>&1 ;;
    *) OUT=$OUT/x KERNELWRIGHT_CACHE=$cache timeout "${KW_KW_LIMIT:-320}" python3 benchmarks/timer_agreement.py kernelwright .corpus "${SEL[@]}" --name "$name" --out "$OUT" --only-timed -- "${extra[@]}" >"$OUT/x/$name.log" 2>&1 ;;
    esac
    echo "$name: exit $? in $((SECONDS - t0)) s, $(wc -l <"$OUT/kw-$name.jsonl" 2>/dev/null) records"
    [ -f "$OUT/x/corpus_suite.json" ] && mv "$OUT/x/corpus_suite.json" "$OUT/x/suite-$name.json"
done
[ -n "${KW_NAMES-suite1}" ] && python3 benchmarks/timer_agreement.py report "$OUT" $(for n in ${KW_NAMES-suite1}; do echo --name "$n"; done) >"$OUT/x/report.log" 2>&1
[ -f "$OUT/agreement.md" ] && head -c 3000 "$OUT/agreement.md"
tar czf "$OUT/logs.tgz" -C "$OUT" x && rm -rf "$OUT/x"
