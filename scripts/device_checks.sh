#!/usr/bin/env bash
# The GPU checks still owed, in the order a device session should run them, each one call of the
# device tool (at most 10 minutes). Logs go under $OUT (the device tool brings them back).
#
#   bash scripts/device_checks.sh handoff   # ~6 min: device hand-off tests, overhead with and without it
#   bash scripts/device_checks.sh turns     # ~2 min: six honest controls at once on one GPU: with the GPU's turn, none trusted outside 0.8-1.25x
#   bash scripts/device_checks.sh whole     # ~9 min: the whole CPU suite, the slow tests CI's gate leaves out too (tests/conftest.py), GPUs hidden;
#                                           #   not CI's machine: some tests fail there for the machine alone (see the mode)
#   bash scripts/device_checks.sh suite2    # ~8 min on two GPUs: the same suite (Mamba-2's tests aside), half of the files on each GPU
#   bash scripts/device_checks.sh suiteall  # the same over every GPU (~4 min on four); KW_THEN: a command after it, in KW_THEN_LIMIT s
#   bash scripts/device_checks.sh suitespread # the same in one pytest run over every GPU: $KW_WORKERS (4) workers a GPU, each
#                                           #   worker on one GPU (KW_SPREAD_GPUS, tests/conftest.py), files to whichever is free
#   bash scripts/device_checks.sh suite     # ~15 min: the whole gpu suite, 4 workers (8 ran the judges out of device memory; KW_PYTEST_ARGS: more pytest arguments, e.g. --ignore=tests/test_mamba2_gpu.py)
#   bash scripts/device_checks.sh mamba     # >10 min now: Mamba-2 gpu tests, paths $KW_PATHS (2,5) at l2048, the side-by-side benchmark
#                                           #   (mamba-tests: the first two only, ~5 min; mamba-bench: the benchmark only, ~9 min;
#                                           #    mamba-final: the benchmark, then the tests in $KW_TESTS_LIMIT s)
#   bash scripts/device_checks.sh profile   # ~4 min: Nsight Compute of paths 2 and 5 at l2048 (fp32, bf16): what limits them
#   bash scripts/device_checks.sh path5     # ~8 min: Mamba-2 gpu tests (path 5 included), paths 2 and 5 at every shape, ncu of both at l2048 fp32
#   bash scripts/device_checks.sh corpus    # $KW_CORPUS_LIMIT (500) s: `suite eval` of the corpus in .corpus (benchmarks/corpus_suite.py)
#   bash scripts/device_checks.sh fresh     # ~3 min: `kernelwright eval` of examples/cuda_swish in fresh CLI processes, cold then cached (records in $OUT)
#   bash scripts/device_checks.sh served    # ~2 min: the same evals handed to a running `kernelwright serve` (cached build first: run `fresh` before)
#   bash scripts/device_checks.sh autoserve # ~3 min: `kernelwright eval` as a user runs it: the first (cold build) starts a server in the
#                                           #   background (serve.autostart), the next fresh CLI processes hand it their jobs; --no-server beside
#   bash scripts/device_checks.sh clock     # ~9 min: the honest speed-ups against the old clock (.old), then the clock's gpu tests
#   bash scripts/device_checks.sh quick     # ~4 min: no tests; paths $KW_PATHS (2,5,6) timed at l2048 (n 128, 64), ncu counts of $KW_NCU_PATHS (5)
#   bash scripts/device_checks.sh scale     # <= ~8 min: `suite eval` of .corpus levels $KW_LEVELS (1,2), the first $KW_PER_LEVEL (15) of each,
#                                           #   on GPU 0, (GPUs 0,1 where there are more than two), then on every GPU, each with a fresh
#                                           #   build cache and at most $KW_SCALE_LIMIT (180) s (the same problems each pass: size the
#                                           #   limit so that the one-GPU pass ends: ~4.2 s a problem on an H200, 20 s of start-up);
#                                           #   prints wall, per problem, each GPU's busy share, stage sums, waits (carry .corpus; KW_CORPUS_DIR: another)
#   bash scripts/device_checks.sh stuck     # ~3 min: a spinning CUDA kernel's stop, an honest Triton first-call compile, a spinning
#                                           #   Triton kernel (benchmarks/stuck_kernel.py; default limits: call_floor 10 s, jit_allowance 120 s)
#   bash scripts/device_checks.sh placements # $KW_PLACE_LIMIT (480) s: each side of the pairs of .agree/final/independent.jsonl
#                                           #   timed by do_bench under each placement of benchmarks/placement_spread.py, a process
#                                           #   a draw, over every GPU (carry .corpus .agree; then `placement_spread.py report`;
#                                           #   an earlier call's placements.jsonl in .agree/: goes on where it stopped)
#   bash scripts/device_checks.sh draws     # $KW_DRAWS_LIMIT (540) s: first-call draws of $KW_KEYS (CUDA-L1's level1/60 and 77) in plain
#                                           #   processes and in `kernelwright eval` under $KW_WAYS (benchmarks/first_call_draws.py; carry .corpus;
#                                           #   KW_SIDE=reference: the problems' Model, as the judge times it)
#
# Carry .deb (bubblewrap for the sandbox tests) with every call, and .scratch/mamba/whl for `mamba`.
set -uo pipefail
MODE=${1:-}  # read before sourcing anything: a sourced script can reset the positional parameters
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kw-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 KW_TEST_CACHE=${KW_TEST_CACHE:-/tmp/kwc}
# (KW_FAILURES_LOG, set per pytest step: each failure's traceback written as it happens, tests/conftest.py;
# a step stopped at its limit prints no summary)
. scripts/install_bwrap_deb.sh >"$OUT/bwrap.log" 2>&1 || echo "bubblewrap not installed: bwrap tests will skip"
# torch's build-in-progress files left by a build this script's time limits stopped in an earlier call
# on a warm machine: torch waits for them for ever (one such wait cost a whole call, 2026-11-23)
find "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}" -name lock -type f -delete 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv >"$OUT/gpu.txt" 2>&1
date -u +%FT%TZ >"$OUT/date.txt"

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, log in $OUT/NAME.log, one status line
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - t0)) s ($(tail -n 1 "$OUT/$name.log" | cut -c1-160))"
}

# ncu_ssd NAME LIMIT DTYPE PATH EXTRA_METRICS SECTION...: one forced tensor-core path at l2048 under Nsight
# Compute (benchmarks/mamba2_ncu_target.py: the second call, after its error is checked)
NCU_METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
ncu_ssd() {
    local name=$1 limit=$2 dt=$3 path=$4 extra=$5
    shift 5
    local sec=()
    for s in "$@"; do sec+=(--section "$s"); done
    step "$name" "$limit" ncu --kernel-name regex:ssd_tc --launch-skip 1 --launch-count 1 "${sec[@]}" \
        --metrics "$NCU_METRICS$extra" --print-units base \
        python3 -m benchmarks.mamba2_ncu_target --shape l2048 --dtype "$dt" --path "$path"
}

case "$MODE" in
handoff)
    step handoff_tests 180 python3 -m pytest -m gpu tests/test_device_handoff_gpu.py -v -p no:cacheprovider
    step overhead_handoff 150 python3 benchmarks/overhead_anatomy.py --device cuda --repeats 3 --skip-pieces
    step overhead_files 150 python3 benchmarks/overhead_anatomy.py --device cuda --repeats 3 --skip-pieces --files
    ;;
corpus)  # a published corpus unpacked into .corpus (benchmarks/corpus_suite.py unpack; carry .corpus; KW_CORPUS_DIR: another)
    step "corpus${KW_STEP_SUFFIX:-}" "$((${KW_CORPUS_LIMIT:-500} + 60))" python3 benchmarks/corpus_suite.py run "${KW_CORPUS_DIR:-.corpus}" \
        --levels "${KW_LEVELS:-1}" --limit "${KW_N:-100}" --name "${KW_NAME:-corpus}" --time-limit "${KW_CORPUS_LIMIT:-500}" \
        -- ${KW_SUITE_ARGS:-}
    ;;
fresh)  # one `kernelwright eval` in a fresh CLI process, cuda_swish: once to fill the build cache, then cached
    for i in 0 1 2; do
        step "fresh_eval_$i" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
            eval examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --json > $OUT/fresh_eval_$i.json"
    done
    python3 -X importtime -c 'import kernelwright.cli.main' 2>&1 | sort -t'|' -k2 -n | tail -15 >"$OUT/cli_importtime.txt"
    ;;
autoserve)  # the first eval (cold build) starts a server after itself; fresh CLI processes after a pause, then at once
    EVAL="examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --json"
    for i in 0 1 2 3; do
        [ "$i" -ge 1 ] && sleep "${KW_PAUSE_S:-10}"  # a person reading the last result
        step "auto_eval_$i" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
            eval $EVAL > $OUT/auto_eval_$i.json"
    done
    step "auto_eval_at_once" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
        eval $EVAL > $OUT/auto_eval_at_once.json"
    step "auto_eval_noserver" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
        eval $EVAL --no-server > $OUT/auto_eval_noserver.json"
    step "auto_stop" 60 python3 -c 'from kernelwright.cli.main import main; main()' serve --stop --device cuda
    cp "$HOME/.cache/kernelwright/serve/eval-cuda.log" "$OUT/" 2>/dev/null
    ;;
served)  # the same evals handed to a running `kernelwright serve` (its spares warm), then --no-server again
    python3 -c 'from kernelwright.cli.main import main; main()' serve --device cuda --idle-minutes 10 >"$OUT/serve.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 600); do [ -S "$HOME/.cache/kernelwright/serve/eval-cuda.sock" ] && break; sleep 0.1; done
    sleep "${KW_SERVE_WARM_S:-15}"  # its spares start up (as they would between a user's commands)
    for i in 0 1 2; do
        step "served_eval_$i" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
            eval examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --json > $OUT/served_eval_$i.json"
        sleep 3
    done
    kill -TERM "$SERVER"; wait "$SERVER"
    step "unserved_eval" 240 bash -c "TIMEFORMAT='wall %R s'; time python3 -c 'from kernelwright.cli.main import main; main()' \
        eval examples/cuda_swish/problem.py examples/cuda_swish/candidate.py --json > $OUT/unserved_eval.json"
    ;;
corpus+fresh)  # the two above, fresh first (bounded), then the corpus with what is left
    bash "$0" fresh
    bash "$0" corpus
    exit 0
    ;;
suite)
    # -v: each test's name and outcome as it ends (a run stopped at the limit prints no summary)
    KW_FAILURES_LOG=$OUT/gpu_suite_tracebacks.txt step gpu_suite "${KW_SUITE_LIMIT:-560}" python3 -m pytest -m gpu -n "${KW_WORKERS:-4}" -v -p no:cacheprovider --durations=25 ${KW_PYTEST_ARGS:-}
    grep -E "timer_escape|FAILED|ERROR" "$OUT/gpu_suite.log" | head -40 >"$OUT/gpu_suite_failures.txt"
    grep -cE " PASSED " "$OUT/gpu_suite.log" >"$OUT/gpu_suite_passed_count.txt"
    ;;
turns)  # ~2 min: six honest controls at once on GPU 0 (scripts/dev_honest.py 2 --alone, six processes),
    # each record's speed-up, whether it is trusted and its GPU turn (engine/child/gpu_turn.py): with
    # turns, no trusted figure outside 0.8-1.25x (before them: 0.021x, 0.25x, 0.34x trusted, 2026-11-29)
    for i in 1 2 3 4 5 6; do
        CUDA_VISIBLE_DEVICES=0 timeout "${KW_TURNS_LIMIT:-300}" python3 scripts/dev_honest.py 2 --alone >"$OUT/turns$i.log" 2>&1 &
    done
    wait
    cat "$OUT"/turns[1-6].log >"$OUT/turns.log" && rm -f "$OUT"/turns[1-6].log
    awk '/: passed /{n++; if ($5 == "trusted=True") {t++; if ($4 < 0.8 || $4 > 1.25) bad++}}
         END {printf "turns: %d records, %d trusted, %d trusted outside 0.8-1.25x\n", n, t, bad}' "$OUT/turns.log"
    ;;
whole)  # the CPU suite with the tests marked slow that CI's gate leaves out (pytest --whole), GPUs hidden, on
    # the device's cores ($KW_WORKERS, 12, workers). Not CI's machine: some tests fail there for the machine
    # alone (its torch is a CUDA build: other messages, a CUDA import over the 2 GiB address-space limit; its
    # many cores: no build gate, other shape budgets; click's help and usage texts). The 2-core run is the check
    step whole "${KW_WHOLE_LIMIT:-570}" env CUDA_VISIBLE_DEVICES= python3 -m pytest --whole -n "${KW_WORKERS:-12}" -p no:cacheprovider --durations=20
    grep -E "^(FAILED|ERROR)" "$OUT/whole.log" | head -40 >"$OUT/whole_failures.txt"
    ;;
suite2|suiteall)  # the gpu suite over every GPU: one pytest run per GPU side by side, each with its
    # own build cache, the files dealt out in turn (heaviest first); Mamba-2's tests left to `mamba`
    NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$MODE" = suite2 ] && NG=$((NG < 2 ? NG : 2))
    NG=$((NG > 0 ? NG : 1))
    mapfile -t files < <(grep -l "mark.gpu" tests/test_*.py | grep -v mamba2 | xargs wc -c | sort -rn | awk '$2 != "total" {print $2}')
    for ((g = 0; g < NG; g++)); do
        share=()
        for i in "${!files[@]}"; do ((i % NG == g)) && share+=("${files[$i]}"); done
        CUDA_VISIBLE_DEVICES=$g KW_TEST_CACHE=/tmp/kwc$g KW_FAILURES_LOG=$OUT/gpu_suite${g}_tracebacks.txt step gpu_suite$g "${KW_SUITE_LIMIT:-540}" \
            python3 -m pytest -m gpu -n "${KW_WORKERS:-4}" -v -p no:cacheprovider --durations=15 "${share[@]}" &
    done
    wait
    grep -hE "timer_escape|FAILED|ERROR" "$OUT"/gpu_suite[0-9].log | head -40 >"$OUT/gpu_suite_failures.txt"
    tail -qn 1 "$OUT"/gpu_suite[0-9].log
    [ -n "${KW_THEN:-}" ] && step then "${KW_THEN_LIMIT:-200}" bash -c "$KW_THEN"  # e.g. the stuck benchmark after it
    ;;
suitespread)  # the files dealt as workers come free (suite2's halves by size ended 230 s apart on 2 x H200)
    NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    NG=$((NG > 0 ? NG : 1))
    # each test's seconds as it ends (gpu_durations.jsonl); carried back as .scratch/gpu_durations.jsonl, the
    # next run deals the longest first (tests/conftest.py KW_LONGEST_FIRST). --dist load, not the project's
    # loadfile: a file's tests on one worker put test_cheats', test_clock_attacks' and test_engine_gpu's ~500 s
    # each (one H200, 6 workers) on one worker apiece, which held the run past its limit; no gpu file has a module
    # fixture to share
    [ -f .scratch/gpu_durations.jsonl ] && export KW_LONGEST_FIRST=$PWD/.scratch/gpu_durations.jsonl
    KW_SPREAD_GPUS=$(seq -s, 0 $((NG - 1))) KW_FAILURES_LOG=$OUT/gpu_suite_tracebacks.txt \
        KW_DURATIONS_LOG=$OUT/gpu_durations.jsonl step gpu_suite "${KW_SUITE_LIMIT:-540}" \
        python3 -m pytest -m gpu -n $((NG * ${KW_WORKERS:-4})) --dist load -v -p no:cacheprovider --durations=25 \
        --ignore=tests/test_mamba2_gpu.py
    grep -E "timer_escape|FAILED|ERROR" "$OUT/gpu_suite.log" | head -40 >"$OUT/gpu_suite_failures.txt"
    tail -n 1 "$OUT/gpu_suite.log"
    ;;
mamba|mamba-tests|mamba-bench|mamba-final)  # mamba_ssm's pure-Python wheel (see benchmarks/mamba2_ssd.py), carried in .scratch/mamba/whl
    if ls .scratch/mamba/whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .scratch/mamba/whl/*.whl \
            && export PYTHONPATH=/tmp/site:$PYTHONPATH
    fi
    # the extension is built in a step of its own (100-140 s), so no benchmark step spends its limit on it
    step build 300 python3 -m benchmarks.mamba2_ncu_target --shape l2048 --dtype fp32 --path 5
    bench() {  # the side-by-side table in two runs (mamba_ssm compiles its Triton kernels per shape and
        # dtype: the whole table took ~320 s on 2026-11-23): a run stopped at its limit loses only its half
        step mamba_bench_short 240 env OUT= python3 benchmarks/mamba2_ssd.py --shapes kb,l2048,l2048n64 --out "$OUT/mamba2_ssd_short.md"
        step mamba_bench_long 240 env OUT= python3 benchmarks/mamba2_ssd.py --shapes l4096,l8192,l16384 --out "$OUT/mamba2_ssd_long.md"
    }
    case "$MODE" in
    mamba-final)  # a bit-identical kernel change: its timing first, the tests with what is left
        bench
        step mamba_tests "${KW_TESTS_LIMIT:-230}" python3 -m pytest -m gpu tests/test_mamba2_gpu.py -n 4 -p no:cacheprovider ;;
    mamba-bench) bench ;;
    *)
        step mamba_tests 300 python3 -m pytest -m gpu tests/test_mamba2_gpu.py -n 4 -p no:cacheprovider
        step mamba_paths 120 python3 benchmarks/mamba2_ssd.py --shapes l2048,l2048n64 --dtypes fp32,bf16 --no-mamba --paths "${KW_PATHS:-2,5}"
        [ "$MODE" = mamba ] && bench ;;
    esac
    ;;
path5)  # the state products in 3xBF16 (path 5) against path 2: correct, then timed, then profiled
    step mamba_tests 300 python3 -m pytest -m gpu tests/test_mamba2_gpu.py -n 4 -p no:cacheprovider
    step mamba_paths 150 python3 benchmarks/mamba2_ssd.py --no-mamba --paths "${KW_PATHS:-2,5,6}"
    for path in ${KW_NCU_PATHS:-2 5 6}; do
        ncu_ssd "ncu_fp32_path${path}" 90 fp32 "$path" ,sm__throughput.avg.pct_of_peak_sustained_elapsed \
            SpeedOfLight WarpStateStats SchedulerStats
    done
    ;;
quick)  # a kernel change timed before its tests are run (the benchmark checks each path's error against float64)
    # KW_SKIP_TIMING=1: profile only (the extension is built first, outside ncu's step limits)
    [ "${KW_SKIP_TIMING:-0}" = 1 ] && step build 300 python3 -m benchmarks.mamba2_ncu_target --shape l2048 --dtype fp32 --path 5
    [ "${KW_SKIP_TIMING:-0}" = 1 ] || step mamba_paths 300 python3 benchmarks/mamba2_ssd.py --shapes l2048,l2048n64 --dtypes fp32,bf16 --no-mamba --paths "${KW_PATHS:-2,5,6}"
    for path in ${KW_NCU_PATHS:-5}; do
        ncu_ssd "ncu_fp32_path${path}" 90 fp32 "$path" ",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
            SpeedOfLight SchedulerStats WarpStateStats
        # the stall reasons (what warps wait on at ~1 eligible warp a scheduler): WarpStateStats alone
        # printed none, with "The optional metric smsp__pcsamp_sample_count could not be found.
        # Collecting it ... could enable the rule": PC sampling (SourceCounters) and that metric. A separate
        # step, not yet run on a device
        # (the report stays on the device: at most 8 files come back from $OUT)
        step "ncu_stalls_path${path}" 150 ncu --kernel-name regex:ssd_tc --launch-skip 1 --launch-count 1 \
            --section WarpStateStats --section SourceCounters --metrics smsp__pcsamp_sample_count \
            --import-source no -f -o "/tmp/stalls_path${path}" \
            python3 -m benchmarks.mamba2_ncu_target --shape l2048 --dtype fp32 --path "$path"
        # the whole report as text, and every SASS instruction with its stall samples (per reason),
        # summarised (scripts/ncu_source_summary.py) and gzipped
        step "ncu_stalls_details${path}" 60 ncu --import "/tmp/stalls_path${path}.ncu-rep" --page details --print-units base
        step "ncu_stalls_source${path}" 60 sh -c "ncu --import /tmp/stalls_path${path}.ncu-rep --page source --csv \
            --print-source sass > /tmp/stalls_sass${path}.csv && python3 scripts/ncu_source_summary.py /tmp/stalls_sass${path}.csv"
        gzip -c "/tmp/stalls_sass${path}.csv" >"$OUT/stalls_sass${path}.csv.gz"
    done
    ;;
profile)  # what limits the tensor-core paths at l2048 (docs/PERFORMANCE.md, "Where the time goes")
    for dt in fp32 bf16; do
        for path in 2 5; do
            ncu_ssd "ncu_${dt}_path${path}" 110 "$dt" "$path" \
                ,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
                SpeedOfLight ComputeWorkloadAnalysis WarpStateStats SchedulerStats MemoryWorkloadAnalysis Occupancy LaunchStats
        done
    done
    ;;
scale)  # where a suite's wall goes on 1 GPU and on every GPU (benchmarks/corpus_suite.py, suites/accounting.py)
    CORPUS=${KW_CORPUS_DIR:-.corpus}
    NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    ALL=$(seq -s, 0 $((NG > 0 ? NG - 1 : 0)))
    LIMIT=${KW_SCALE_LIMIT:-180}
    PASSES="1:0"
    [ "$NG" -gt 2 ] && PASSES="$PASSES 2:0,1"  # four GPUs: 1, 2 and 4 (KW_SCALE_LIMIT=150 fits one call)
    [ "$NG" -gt 1 ] && PASSES="$PASSES $NG:$ALL"  # one GPU only: its pass alone
    PASSES=${KW_SCALE_PASSES:-$PASSES}  # e.g. 1:1, GPU 1 alone (--gpus takes CUDA_VISIBLE_DEVICES entries)
    for pass in $PASSES; do
        n=${pass%%:*} gpus=${pass#*:}
        rm -rf "$CORPUS/runs/scale_${n}gpu"  # nothing resumed: every problem evaluated in this pass
        cache=$(mktemp -d /tmp/kw-scale-cache-XXXX)  # a fresh build cache: each pass pays its builds
        step "scale_${n}gpu" $((LIMIT + 90)) env KERNELWRIGHT_CACHE="$cache" OUT="$OUT/scale_${n}gpu" \
            python3 benchmarks/corpus_suite.py run "$CORPUS" --levels "${KW_LEVELS:-1,2}" --per-level "${KW_PER_LEVEL:-15}" \
            --name "scale_${n}gpu" --time-limit "$LIMIT" -- --gpus "$gpus" ${KW_SUITE_ARGS:-}
        python3 - "$OUT/scale_${n}gpu/corpus_suite.json" "$n" <<'PY' | tee "$OUT/scale_${n}gpu.txt"
import json, sys
s = json.load(open(sys.argv[1]))
a = s.get("accounting") or {}
print(f"{sys.argv[2]} GPU(s), {s.get('device')}: {a.get('problems')} problems in {a.get('wall_s')} s "
      f"({a.get('wall_per_problem_s')} s a problem), stopped at the limit: {s.get('stopped_at_time_limit')}")
print(f"  GPU busy share {a.get('gpu_busy', {}).get('share')}; per GPU {json.dumps(a.get('gpu_busy', {}).get('per_gpu'))}")
print(f"  stage sums {json.dumps(a.get('stage_sum_s'))}; start-up on the path {json.dumps(a.get('startup_on_path'))}")
print(f"  builds waited for a builder {a.get('builds_waited_for_a_builder_s')} s ({a.get('builds_prebuilt')} prebuilt), "
      f"GPU waited for builds {a.get('gpu_waited_for_builds_s')} s; record latency {json.dumps(a.get('record_latency'))}")
print(f"  verdicts {json.dumps(s.get('verdicts'))}; prebuilds {json.dumps(s.get('builds_in_prebuild_s'))}")
PY
        mv "$OUT/scale_${n}gpu/corpus_suite.log" "$OUT/scale_${n}gpu_suite.log" 2>/dev/null
        rm -f "$OUT/scale_${n}gpu/corpus_suite.md"  # the json holds it all
        rm -rf "$cache"
    done
    ;;
draws)  # what moves an autotuned candidate's first-call draw: a way a mechanism is off, fresh processes, interleaved
    step draws "${KW_DRAWS_LIMIT:-540}" python3 benchmarks/first_call_draws.py run "${KW_CORPUS_DIR:-.corpus}" \
        --keys "${KW_KEYS:-level1/77_conv_transposed_3D_square_input_square_kernel___padded____dilated____strided__,level1/60_conv_standard_3D__square_input__asymmetric_kernel}" \
        --ways "${KW_WAYS:-plain,tools_first,kw:default}" --draws "${KW_N:-2}" --side "${KW_SIDE:-candidate}" --out "$OUT"
    tail -n 20 "$OUT/draws.log"
    ;;
placements)  # how far where the driver places a side's memory moves its do_bench figure
    NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    # an earlier call's rows (carried as .agree/placements.jsonl): this one goes on where it stopped
    [ -f .agree/placements.jsonl ] && cp .agree/placements.jsonl "$OUT/placements.jsonl"
    PYTHONPATH=$PWD/src:$PWD step placements "${KW_PLACE_LIMIT:-480}" python3 benchmarks/placement_spread.py run .corpus \
        --pairs-from "${KW_PAIRS_FROM:-.agree/final/independent.jsonl}" --out "$OUT" --gpus "$((NG > 0 ? NG : 1))" \
        --build-jobs 16 --limit-s "$(( ${KW_PLACE_LIMIT:-480} - 30 ))"
    wc -l <"$OUT/placements.jsonl"
    ;;
stuck)  # a stuck kernel stopped within the floor; an honest first-call compile not timed out (engine/compile_watch.py)
    step stuck "${KW_STUCK_LIMIT:-400}" python3 benchmarks/stuck_kernel.py --device cuda
    ;;
clock)  # the judge's clock against the old one (carry .old: `git archive 3f26e59 src | tar -x -C .old`), then its gpu tests
    KW_PAIRS=${KW_PAIRS:-cuda_swish,mamba2_state,mamba2_y,honest_control,suite_swish} KW_REPEATS=${KW_REPEATS:-1} \
        KW_LIMIT=${KW_LIMIT:-330} bash scripts/dev_side_by_side.sh >"$OUT/side_summary.log" 2>&1
    grep -A8 "^pair " "$OUT/side_summary.log"
    # --dist load: the attacks spread over the workers (a file's tests on one worker took 200 s)
    step clock_tests "${KW_TESTS_LIMIT:-200}" python3 -m pytest -m gpu -n 4 --dist load --timeout 150 -v -p no:cacheprovider \
        tests/test_clock_attacks.py tests/test_device_clock.py
    ;;
*)
    modes=$(grep -oE '^[a-z0-9+|-]+\)' "$0" | tr -d ')' | paste -sd'|')  # this file's own modes, as it reads them
    echo "usage: bash scripts/device_checks.sh $modes (the modes are described at the top of $0)" >&2
    exit 2
    ;;
esac

# at most 8 files come back from $OUT: the logs and small text files go into one, all.log
for f in "$OUT"/*.log "$OUT"/*.txt; do
    [ -f "$f" ] || continue
    printf '\n===== %s =====\n' "$(basename "$f")" >>"$OUT/all.log.tmp"
    cat "$f" >>"$OUT/all.log.tmp"
    rm -f "$f"
done
[ -f "$OUT/all.log.tmp" ] && cat "$OUT/all.log.tmp" >>"$OUT/all.log" && rm -f "$OUT/all.log.tmp"
exit 0
