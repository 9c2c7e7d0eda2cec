#!/usr/bin/env bash
# The timer agreement with kernelwright first (carry .deb .corpus .agree), on one GPU, one call a phase:
#   KW_PHASE=1: `suite eval` run `a3` over CUDA-L1's level-3 pairs and run `a12` over levels 1-2 (the pairs
#     whose candidates build no extension: those that pass), each to its time limit; then the independent
#     timers (do_bench, back-to-back, each side alone in its own process) on the pairs it passed.
#   KW_PHASE=2 (after copying phase 1's files into .agree/): the independent timers go on where phase 1
#     stopped; runs `r2` and `r3` over every pair with independent figures, `al` (`eval` alone) over
#     $KW_ALONE between them; a second independent pass (ind2/, the independent timers' own run to run,
#     not in the report) if time is left; then the report.
#   KW_PHASE=3 (after copying the earlier files into .agree/): run `fx` over the pairs $KW_KEYS (a change
#     re-timed), reported beside the earlier runs.
#   KW_PHASE=4 (every GPU of the machine): run $KW_B_NAME (b1) over levels $KW_B_LEVELS (1,2,3; in that order, to
#     its limit), candidates that build included, then the independent timers on what it passed, split over
#     the GPUs (pre-builds $KW_BUILD_JOBS at a time). With .agree/ carried, KW_B_NAME=b0 KW_B_LEVELS=3 adds level 3.
#   KW_PHASE=5 (every GPU, after phase 4 on the same warm machine, or with its files in $KW_FROM, .agree/): runs $KW_RUNS
#     (`b2 b3`) over the pairs with independent figures in levels $KW_R_LEVELS (1,2,3), then the report over every kw-b*.jsonl.
# KW_SUITE_ARGS: more options of `suite eval` (e.g. "--draws 3").
# KW_WORK: where the rows are kept between phases (/tmp lasts while the machine stays warm); copied to $OUT.
# Limits (seconds): KW_L3, KW_L12, KW_IND (phase 1); KW_R (each run), KW_ALONE_S, KW_IND (phase 2).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-ap}
RET=$OUT  # what comes back
OUT=${KW_WORK:-$OUT}
mkdir -p "$OUT/x" "$RET"
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
NG=$((NG > 0 ? NG : 1))
ALL=$(seq -s, 0 $((NG - 1)))
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
. scripts/install_bwrap_deb.sh >"$OUT/x/bwrap.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u +%FT%TZ; git log -1 --format=%h; } >"$OUT/x/machine.txt" 2>&1
kw() {  # NAME LEVELS LIMIT_S [selection...]
    local name=$1 levels=$2 limit=$3 t0=$SECONDS; shift 3
    KW_SUITE_LIMIT=$((limit - 20)) OUT=$OUT/x KERNELWRIGHT_CACHE=/tmp/kw-agree-cache timeout "$limit" \
        python3 benchmarks/timer_agreement.py kernelwright .corpus --levels "$levels" --name "$name" --out "$OUT" "$@" \
        -- --gpus "${KW_GPUS:-0}" ${KW_SUITE_ARGS:-} >"$OUT/x/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s, $(grep -c '"passed"' "$OUT/kw-$name.jsonl" 2>/dev/null) passed of $(wc -l <"$OUT/kw-$name.jsonl" 2>/dev/null)"
    [ -f "$OUT/x/corpus_suite.json" ] && mv "$OUT/x/corpus_suite.json" "$OUT/x/suite-$name.json"
}
ind() {  # DEST LIMIT_S then the selection
    local dest=$1 limit=$2 t0=$SECONDS; shift 2
    mkdir -p "$dest"
    timeout "$((limit + 30))" python3 benchmarks/timer_agreement.py independent .corpus --levels 1,2,3 "$@" \
        --out "$dest" --limit-s "$limit" --timeout 90 --gpus "${KW_NGPU:-1}" --build-jobs "${KW_BUILD_JOBS:-0}" \
        >>"$OUT/x/ind.log" 2>&1
    echo "independent into $dest: exit $? in $((SECONDS - t0)) s, $(wc -l <"$dest/independent.jsonl" 2>/dev/null) rows"
}
if [ "${KW_PHASE:-1}" = 1 ]; then
    kw a3 3 "${KW_L3:-170}" --no-builds
    kw a12 1,2 "${KW_L12:-220}" --no-builds
    ind "$OUT" "${KW_IND:-150}" --passed-in "$OUT/kw-a3.jsonl" --passed-in "$OUT/kw-a12.jsonl"
    names="a3 a12"
elif [ "${KW_PHASE}" = 4 ]; then  # every GPU, builds included
    export KW_GPUS=$ALL KW_NGPU=$NG KW_BUILD_JOBS=${KW_BUILD_JOBS:-16}
    # a run beside earlier ones (KW_B_NAME other than b1): their rows with it, so the report and phase 5 see all
    [ "${KW_B_NAME:-b1}" != b1 ] && [ ! -f "$OUT/independent.jsonl" ] && cp .agree/independent.jsonl .agree/kw-b*.jsonl "$OUT/"
    kw "${KW_B_NAME:-b1}" "${KW_B_LEVELS:-1,2,3}" "${KW_B:-300}"
    ind "$OUT" "${KW_IND:-240}" --passed-in "$OUT/kw-${KW_B_NAME:-b1}.jsonl"
    names="${KW_B_NAME:-b1}"
elif [ "${KW_PHASE}" = 5 ]; then
    export KW_GPUS=$ALL KW_NGPU=$NG
    [ -f "$OUT/independent.jsonl" ] || cp "${KW_FROM:-.agree}"/independent.jsonl "${KW_FROM:-.agree}"/kw-b*.jsonl "$OUT/"
    # KW_R_KEYS: the pairs (level1/46_task,...), or @FILE of the tree that holds them (a long list outgrows a command)
    case "${KW_R_KEYS:-}" in @*) KW_R_KEYS=$(tr -d ' \n' <"${KW_R_KEYS#@}") || exit 2 ;; esac
    for n in ${KW_RUNS:-b2 b3}; do kw "$n" "${KW_R_LEVELS:-1,2,3}" "${KW_R:-150}" --only-timed ${KW_R_KEYS:+--keys "$KW_R_KEYS"}; done
    names="$(cd "$OUT" && ls kw-b*.jsonl | sed 's/^kw-//; s/\.jsonl$//' | tr '\n' ' ')"
elif [ "${KW_PHASE}" = 3 ]; then  # a change re-timed: run `fx` over $KW_KEYS (pairs with independent figures) beside the earlier runs
    cp .agree/independent.jsonl .agree/kw-*.jsonl "$OUT/"
    kw fx 1,2,3 "${KW_R:-150}" --only-timed --keys "$KW_KEYS"
    names="$(cd "$OUT" && ls kw-*.jsonl | sed 's/^kw-//; s/\.jsonl$//' | tr '\n' ' ')"
else
    cp .agree/independent.jsonl .agree/kw-*.jsonl "$OUT/"
    ind "$OUT" "${KW_IND:-60}" --passed-in "$OUT/kw-a3.jsonl" --passed-in "$OUT/kw-a12.jsonl"
    kw r2 1,2,3 "${KW_R:-190}" --only-timed
    names="a3 a12 r2"
    if [ -n "${KW_ALONE:-}" ]; then  # `kernelwright eval` alone, one pair at a time, nothing else on the GPU
        t0=$SECONDS
        timeout "${KW_ALONE_S:-170}" python3 benchmarks/timer_agreement.py kernelwright .corpus --levels 1,2,3 --name al \
            --out "$OUT" --alone --keys "$KW_ALONE" >"$OUT/x/al.log" 2>&1
        echo "al: exit $? in $((SECONDS - t0)) s, $(wc -l <"$OUT/kw-al.jsonl" 2>/dev/null) records"
        names="$names al"
    fi
    kw r3 1,2,3 "${KW_R:-190}" --only-timed
    names="$names r3"
    left=$((560 - SECONDS))
    [ "$left" -gt 40 ] && ind "$OUT/ind2" "$((left - 30))" --pairs-from "$OUT/independent.jsonl"
fi
python3 benchmarks/timer_agreement.py report "$OUT" $(for n in $names; do echo --name "$n"; done) >"$OUT/x/report.log" 2>&1
[ -f "$OUT/agreement.md" ] && head -c 3000 "$OUT/agreement.md"
tar czf "$RET/logs-${KW_PHASE:-1}.tgz" -C "$OUT" x
if [ "$RET" != "$OUT" ]; then cp "$OUT"/*.jsonl "$OUT"/agreement.* "$RET/" 2>/dev/null; else rm -rf "$OUT/x"; fi
ls -la "$RET"
