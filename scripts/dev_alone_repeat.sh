#!/usr/bin/env bash
# The same candidates evaluated alone, three times each (`kernelwright eval --no-server` in a fresh CLI
# process per pair, nothing else on its GPU), their pairs dealt over every GPU of the machine; then the
# report over those runs against the independent timers in .agree/cupti (carry .deb .corpus .agree).
# KW_KEYS: the pairs (level1/46_task,...); KW_RUNS: the run names (a1 a2 a3). Three files come back.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${KW_KEYS:?set KW_KEYS to the pairs, e.g. level1/46_task,level2/7_task}"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT"
. scripts/install_bwrap_deb.sh >"$OUT/log.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u +%FT%TZ; git log -1 --format=%h; } >>"$OUT/log.txt" 2>&1
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
NG=$((NG > 0 ? NG : 1))
IFS=, read -r -a keys <<<"$KW_KEYS"
W=/tmp/kw-alone
for ((g = 0; g < NG; g++)); do
    mine=$(for i in "${!keys[@]}"; do ((i % NG == g)) && printf '%s,' "${keys[$i]}"; done)
    (
        for run in ${KW_RUNS:-a1 a2 a3}; do
            CUDA_VISIBLE_DEVICES=$g KERNELWRIGHT_CACHE=/tmp/kw-alone-cache$g python3 benchmarks/timer_agreement.py \
                kernelwright .corpus --levels 1,2,3 --alone --keys "${mine%,}" --name "$run" --out "$W/g$g" \
                >>"$OUT/log.txt" 2>&1
        done
    ) &
done
wait
mkdir -p "$W/all"
cp .agree/cupti/independent.jsonl "$W/all/"
names=""
for run in ${KW_RUNS:-a1 a2 a3}; do
    cat "$W"/g*/kw-"$run".jsonl >"$W/all/kw-$run.jsonl"
    names="$names --name $run"
done
date -u +%FT%TZ >>"$OUT/log.txt"
# shellcheck disable=SC2086
python3 benchmarks/timer_agreement.py report "$W/all" $names >/dev/null 2>>"$OUT/log.txt"
cat "$W"/all/kw-*.jsonl >"$OUT/kw-alone.jsonl"
cp "$W/all/agreement.md" "$OUT/"
