#!/usr/bin/env bash
# The independent timers again, the profiler's device busy time (cupti) among them, on the pairs the
# earlier runs passed (carry .corpus .agree), every GPU of the machine; then the report over those
# runs' records (.agree/kw-b*.jsonl) against these figures. Four files come back under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
W=/tmp/kw-cupti
mkdir -p "$W" "$OUT"
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u +%FT%TZ; git log -1 --format=%h; } >"$OUT/log.txt" 2>&1
cp .agree/kw-b*.jsonl "$W/"
# an earlier call's rows (.agree/cupti/independent.jsonl): this one goes on with the pairs it did not reach
[ -f .agree/cupti/independent.jsonl ] && cp .agree/cupti/independent.jsonl "$W/"
names=$(ls "$W" | sed -n 's/^kw-\(b[0-9]*\)\.jsonl$/\1/p' | sort -V | tr '\n' ' ')
passed=$(for n in $names; do printf -- '--passed-in %s ' "$W/kw-$n.jsonl"; done)
t0=$SECONDS
# shellcheck disable=SC2086
timeout "${KW_IND_S:-450}" python3 benchmarks/timer_agreement.py independent .corpus --levels 1,2,3 $passed \
    --out "$W" --gpus "$NG" --build-jobs 16 --timeout 90 --limit-s "${KW_LIMIT_S:-380}" >>"$OUT/log.txt" 2>&1
echo "independent: exit $? in $((SECONDS - t0)) s, $(wc -l <"$W/independent.jsonl") rows" >>"$OUT/log.txt"
# shellcheck disable=SC2086
python3 benchmarks/timer_agreement.py report "$W" $(for n in $names; do printf -- '--name %s ' "$n"; done) >/dev/null 2>>"$OUT/log.txt"
cp "$W/independent.jsonl" "$W/agreement.md" "$W/agreement.json" "$OUT/" 2>>"$OUT/log.txt"
