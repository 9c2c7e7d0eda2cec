"""All configuration in one typed place.

Standard library only: the evaluation child receives `EvalConfig` as JSON and rebuilds it.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

Device = Literal["auto", "cuda", "cpu"]
SandboxMode = Literal["auto", "bwrap", "none"]
# What "auto" becomes at an entry point (kernelwright.engine.config_resolution); the engine takes only these.
ResolvedDevice = Literal["cuda", "cpu"]
ResolvedSandbox = Literal["bwrap", "none"]
VerdictMode = Literal["strict", "calibrated"]
ShapesMode = Literal["check", "strict", "off"]
OracleDtype = Literal["float64", "float32"]
ModelMode = Literal["as_constructed", "eval"]


def default_cache_dir() -> Path:
    """Build cache shared by all evaluations of this user (`KERNELWRIGHT_CACHE` overrides)."""
    env = os.environ.get("KERNELWRIGHT_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelwright"


@dataclass
class StageTimeouts:
    """Hard wall-clock limits per stage, in seconds; the child's whole process group is killed past them."""

    startup: float = 120.0  # python + torch import in the child
    build: float = 600.0  # import of the candidate, extension builds included
    init: float = 120.0  # constructing Model and ModelNew
    correctness: float = 180.0  # all trials
    # A check that never returns is stopped sooner: the correctness stage (every trial and guarded
    # call of the candidate) ends within max(call_floor, call_factor x the reference's own time for
    # the same calls), never later than `correctness`; before the stage's first report, for as long
    # as a compile is seen at work (a compiler in the runner's tree, its JIT caches growing:
    # engine/compile_watch.py) up to jit_allowance more, and jit_allowance whole for a candidate
    # that compiles out of sight (torch.compile's tracing). call_factor = 0 keeps the flat limit.
    call_floor: float = 10.0
    call_factor: float = 100.0
    jit_allowance: float = 120.0
    timing: float = 300.0
    profile: float = 300.0


@dataclass
class TimingConfig:
    """The timing stage (engine/child/timing/): the judge's windows of back-to-back calls on fresh
    inputs (`windows`, `window_ms`, `max_window_calls`), its clocks, and the rules that withhold trust."""

    # not acted on, kept so that settings files that name them still load: the per-call protocol of
    # triton's do_bench (warm-up and repetition budgets, an L2 flush before each call) that the
    # windows replaced (each call of a window reads an input set of its own instead)
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 1000
    min_warmup: int = 3
    flush_l2: bool = True
    compare_compile: bool = False  # also time torch.compile(reference)
    # Stability (engine/child/timing/stability.py): one fixed, recorded CPU thread count for candidate and
    # reference (0: every core this process may use); load, drift and band checks.
    cpu_threads: int = 0
    # not acted on, kept so that settings files that name them still load: the checks always run (a
    # speed-up is trusted only where they find nothing), and the stage never repeats (its window plan
    # sets the budget)
    stability_checks: bool = True
    stability_retries: int = 2
    max_drift: float = 0.2  # median of the stage's second half vs its first half
    max_band: float = 2.0  # p90 / p10 of a side's windows
    # on a GPU, p90/p10 of a side's windows: work its device paces stays far inside it, while a model
    # whose many small launches the host paces spreads beyond it and its time is a draw of the host's
    # pace, for any timer (the measurements: docs/PERFORMANCE.md, benchmarks/host_load.py)
    max_band_device: float = 1.25
    load_slack_cores: float = 0.5  # other processes may keep this much of our threads' cores busy
    # on the judge's wall clock, windows whose time per call is over this multiple of the runner's own
    # account of its calls held costs that did not come off: the speed-up is not resolved (0: no check).
    # 10%: what the judge can see of its error stays well inside the 0.8-1.25x that the same code timed
    # twice must read (the same calls also run 5-15% slower in the runner's process than in the judge's
    # on a quiet 2-core CPU, which the judge cannot see)
    max_unresolved: float = 1.1
    # on the judge's wall clock, the speed-up of each window (the reference's window over the
    # candidate's beside it) may spread by this p90/p10 at most: a figure that moves more from one
    # window to the next is not resolved to the 0.8-1.25x an identical candidate must read (0: no check)
    max_ratio_spread: float = 1.25
    # on the device basis, a side's host may take this factor x its device time to launch a call, and
    # the speed-up as launched (each side's calls launched one at a time, host included) may differ
    # from the device's by this factor either way, before `launch_bound` says so: a timer that waits
    # for the host (back-to-back calls) reads another figure (0: no check)
    max_launch_gap: float = 1.25
    # The judge's clock (engine/child/timing/): windows of back-to-back calls on fresh inputs.
    windows: int = 5  # timed windows of each side (after one warm-up window)
    # whole evaluations of a passed candidate, each in processes of its own, the record the median's
    # (engine/draws.py): a side's time moves from process to process, never within one's windows
    draws: int = 1
    # on a GPU, a side whose windows spread beyond this (slowest / fastest) once they are timed gets
    # `more_windows` more pairs, once: a burst of another context's work (or a slower clock) slows a
    # few windows in a row on both sides, and three of five move the median; of eleven, six must
    # (docs/PERFORMANCE.md, "Run to run"). 0 more: none
    more_windows_band: float = 1.10
    more_windows: int = 6
    window_ms: float = 25.0  # the reference work one window aims at (sets = window_ms / reference time)
    max_window_calls: int = 256  # input sets per window at most
    window_budget_mb: int = 0  # memory for a window's sets, outputs and snapshot (0: a share of what is free)
    window_deadline_s: float = 10.0  # a window ends within max(this, 100 x its reference time), or times out
    # on a GPU a trusted process measures a window's costs besides the calls (engine/child/timing/probe.py)
    probe: bool = True
    # on a GPU the judge's stream spans the runner's work (engine/child/timing/device_clock.py)
    device_clock: bool = True
    # on a GPU one evaluation drives the device at a time: a judge waits this long for the GPU's turn
    # before its checks (engine/child/gpu_turn.py), then goes on with its timing untrusted (0: no turns)
    gpu_turn_wait_s: float = 300.0
    physics_margin: float = 0.7  # a time under this share of the roofline floor is faster than the hardware


@dataclass
class EvalConfig:
    device: Device = "auto"
    trials: int = 5
    atol: float = 1e-3
    rtol: float = 1e-3
    seed: int = 42
    # The mode both models run in. "as_constructed" (KernelBench's and the published figures'): neither
    # .train() nor .eval() is called, so a freshly built BatchNorm normalises by its batch's statistics
    # and a Dropout draws; "eval": both in eval mode (running statistics: a fresh BatchNorm is nearly the
    # identity, and a candidate that leaves it out passes).
    model_mode: ModelMode = "as_constructed"
    verdict: VerdictMode = "calibrated"
    # Other sizes of the problem (engine/child/shapes.py, docs/VERDICTS.md): a passed candidate gets one
    # more trial at each size derived from the problem's constants. check: a failure there is the
    # report-only flag `shape_specific`; strict: it fails the verdict; off: not checked.
    shapes: ShapesMode = "check"
    # One forward of a passed CUDA candidate under compute-sanitizer memcheck, the caching allocator
    # off (engine/sanitizer.py): an out-of-bounds or misaligned access raises `memory_error`.
    sanitize: bool = False
    time_candidate: bool = True
    timeouts: StageTimeouts = field(default_factory=StageTimeouts)
    timing: TimingConfig = field(default_factory=TimingConfig)
    sandbox: SandboxMode = "auto"
    cache_dir: str = field(default_factory=lambda: str(default_cache_dir()))
    keep_workdir: bool = False
    # get_inputs() runs with the evaluation's device as torch's default device (inputs are drawn
    # on the GPU, not drawn on the CPU and copied: seconds per evaluation for large inputs);
    # a get_inputs that fails that way runs on the CPU, as KernelBench does.
    inputs_on_device: bool = True
    # CUDA outputs pass from the runner to the judge on the device (engine/child/device_handoff.py:
    # an exported allocation's descriptor on a socket), not through files in host memory; off, or
    # where the driver cannot export, they go into the output files (docs/SANDBOX.md). On by
    # default: several times less engine overhead than files for large outputs (docs/PERFORMANCE.md).
    device_handoff: bool = True
    # A CPU evaluation's judge is forked from a process of this one that imported torch once
    # (engine/zygote_client.py) rather than started fresh: a torch import less per evaluation (1.5 s of
    # CPU on a 2-core machine). The judge runs no candidate code.
    fork_judge: bool = True
    # A CPU evaluation's runner forked from a zygote that imported torch once inside the runner's
    # sandbox (engine/runner_fork.py), which confines each fork in namespaces of its own; where the
    # kernel refuses that (or with False), the runner is started fresh in its own sandbox.
    fork_runner: bool = True
    # Names of extra environment variables to pass to the child (on top of the safe allow-list).
    pass_env: tuple[str, ...] = ()
    # The GPU(s) the evaluation child may see (CUDA_VISIBLE_DEVICES), set by an executor that pins
    # one worker per GPU; None: the caller's own visibility.
    visible_devices: str | None = None
    # Host memory the evaluation child (and its builds) may use, in MiB. None: three quarters of
    # the machine's RAM; 0: no limit. RLIMIT_AS on a CPU evaluation, a cgroup's limit where one is
    # writable (the only limit for CUDA, whose driver reserves huge address space); see
    # engine/isolation/containment.py and docs/SANDBOX.md. What was in force: metadata["isolation"].
    memory_limit_mb: int | None = None
    profile: ProfileConfig = field(default_factory=lambda: ProfileConfig())
    build: BuildConfig = field(default_factory=lambda: BuildConfig())
    numerics: NumericsConfig = field(default_factory=lambda: NumericsConfig())
    guards: GuardConfig = field(default_factory=lambda: GuardConfig())
    # where these settings were read from (core/settings_file.py sets it; no file may): the record's
    # metadata["settings"] names it
    settings_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalConfig:
        """The configuration `to_dict` wrote (JSON's lists become tuples, nested tables their
        dataclasses); an unknown key or a value outside its field's type is a ValueError naming it."""
        return build(cls, data)

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the fix."""
        check_values(self)
        if self.trials < 1:
            raise ValueError(f"--trials must be at least 1 (got {self.trials})")
        if self.atol < 0 or self.rtol < 0:
            raise ValueError("--atol and --rtol must be non-negative")
        if self.memory_limit_mb is not None and self.memory_limit_mb < 0:
            raise ValueError(
                f"memory_limit_mb must be 0 (no limit), a positive number of MiB or unset (got {self.memory_limit_mb})"
            )
        self.profile.validate()
        if self.numerics.factor < 1:
            raise ValueError(f"numerics.factor must be at least 1 (got {self.numerics.factor})")
        for name in ("excess_floor", "excess_floor_low"):
            if not 0 <= getattr(self.numerics, name) < 1:
                raise ValueError(f"numerics.{name} must be in [0, 1) (got {getattr(self.numerics, name)})")
        if self.timing.cpu_threads < 0:
            raise ValueError(f"timing.cpu_threads must be 0 (every core) or positive (got {self.timing.cpu_threads})")
        if self.timing.draws < 1:
            raise ValueError(f"--draws (timing.draws) must be at least 1 (got {self.timing.draws})")
        unknown = set(self.guards.fail_on) - set(GUARD_FLAGS)
        if unknown:
            raise ValueError(f"guards.fail_on names unknown guards {sorted(unknown)}; known: {', '.join(GUARD_FLAGS)}")

    def check_resolved(self) -> None:
        """Raise ValueError unless device and sandbox are concrete: "auto" is resolved once, at the
        entry point (the command line, `kernelwright.evaluate`, an executor), never in the engine."""
        for name in ("device", "sandbox"):
            if getattr(self, name) == "auto":
                raise ValueError(
                    f"EvalConfig.{name} is 'auto' in the engine; resolve the configuration at the entry point "
                    "(kernelwright.engine.config_resolution.resolve_config)"
                )


@dataclass
class NumericsConfig:
    """The float64 oracle and the `calibrated` verdict (docs/VERDICTS.md).

    `calibrated`: a candidate output passes when its error against the oracle is within
    atol/rtol, or when it is no worse than `factor` times the float32 reference's own error
    against the oracle, both in max-abs (elementwise) and in normwise relative terms.
    `factor` = 8: honest float32 reorderings (tiling, split-K, tree reductions, FMA) differ
    from each other by ~1-4x in error; bf16/fp16/tf32 carry 2^8-2^16 times float32's unit
    roundoff, so any factor between ~4 and ~100 separates them; 8 leaves headroom both ways.
    """

    oracle: bool = True  # evaluate the oracle (the reference module and inputs upcast)
    oracle_dtype: OracleDtype = "float64"  # float32: for bf16/fp16 problems on a slow-fp64 GPU
    factor: float = 8.0
    # The element-by-element test of the factor branch (docs/VERDICTS.md): a candidate may have at
    # most factor x the reference's share out of tolerance, plus this share, of elements whose error
    # exceeds factor x max(the reference's error there, the tolerance). Correct candidates measured 0.
    excess_floor: float = 1e-4
    # The same floor for low-precision outputs (bf16, fp16), whose tolerance is also raised to one ulp
    # of their dtype: a bf16 kernel may keep intermediates in bf16 (mamba_ssm does); measured on the
    # bf16 Mamba-2 problem 0.4% of elements past the test that way, bugs 60-80% (docs/VERDICTS.md).
    excess_floor_low: float = 1e-2
    localize: bool = True  # add where/how lines to a failing comparison's message


# Every guard flag the child can raise (engine/child/guards.py says what each means).
GUARD_FLAGS = (
    "patched_functions",  # timing, verifier or torch functions replaced by the candidate
    "mutates_inputs",  # inputs changed in place (beyond what the reference does to them)
    "output_aliases_input",  # an output shares memory with an input (the reference's does not)
    "output_changed_later",  # an earlier output changed when the candidate ran again
    "stale_output_on_refill",  # wrong output after inputs were refilled in place (same addresses)
    "calls_reference",  # code of the problem file ran inside ModelNew
    "unwritten_output",  # NaN where memory was filled with NaN before the candidate ran
    "background_threads",  # Python threads left running by the candidate
    "timed_output_mismatch",  # an output of a timed call was wrong
    "no_custom_kernel",  # ModelNew launched only PyTorch's built-in kernels
    "lower_precision_suspected",  # error level of bf16/fp16 arithmetic (a hint, the numerics decide)
    "degenerate_reference",  # the reference's output does not depend on its input: the speed-up means nothing
    "timing_unstable",  # the timing conditions changed during the stage: the speed-up is not to be trusted
    "faster_than_hardware",  # the judge's time beats the roofline floor: a forged timer or skipped work
    "shape_specific",  # correct at the problem's own sizes, wrong at other sizes of it (EvalConfig.shapes)
    "memory_error",  # an out-of-bounds or misaligned access under compute-sanitizer (EvalConfig.sanitize)
    "borderline",  # the error within 2x of the tolerance's edge, either side: another draw may decide otherwise
    "launch_bound",  # a side's host is slower than its device, or the speed-up as launched differs: a fact of timing
    "random_reference",  # the reference draws at random as constructed: both models ran in eval mode
    "autotuned",  # the candidate's process turned on autotuning (cudnn.benchmark): its speed is a draw
    "self_timed",  # the candidate's source reads a clock: it may pick its path, and its error, by the load
)
# Flags that report a fact about the problem or the machine, never the candidate's fault.
REPORT_ONLY_FLAGS = (
    "no_custom_kernel",
    "lower_precision_suspected",
    "degenerate_reference",
    "timing_unstable",
    "faster_than_hardware",
    "shape_specific",
    "borderline",
    "launch_bound",
    "random_reference",
    "autotuned",
    "self_timed",
)


@dataclass
class GuardConfig:
    """Reward-hacking guards: which run, and which flags fail the verdict (status `incorrect`)."""

    enabled: bool = True
    nan_fill: bool = True  # fill uninitialised memory with NaN while the candidate is checked (never while timed)
    check_timed_outputs: bool = True  # not acted on: a timed call's outputs are always checked (docs/SANDBOX.md)
    refill_inputs: bool = True
    profile_kernels: bool = True  # look for a kernel of the candidate's own (no_custom_kernel)
    fail_on: tuple[str, ...] = tuple(f for f in GUARD_FLAGS if f not in REPORT_ONLY_FLAGS)


ProfileTool = Literal["auto", "ncu", "torch"]


@dataclass
class ProfileConfig:
    """Hardware evidence for a correct candidate: kernel profile, roofline, GPU facts.

    `enabled` adds a profile of the candidate's forward (ncu where it works, else torch.profiler).
    `roofline` (on by default) adds the roofline line and the device's facts to every timed,
    correct candidate; it costs one FLOP-counted reference forward, plus a one-time measurement of
    copy bandwidth and matmul rate per device, cached under the cache directory.
    """

    enabled: bool = False
    tool: ProfileTool = "auto"  # auto: ncu when it works on this machine, else torch.profiler
    ncu_path: str = ""  # empty: `ncu` on PATH, then $CUDA_HOME/bin and /usr/local/cuda/bin
    metric_set: str = "judge"  # the fixed set in engine/nsight.py (METRIC_SETS)
    max_kernels: int = 8  # ncu profiles at most this many kernel launches (--launch-count)
    forward_runs: int = 2  # forwards run under ncu (the first one warms up lazy initialisation)
    roofline: bool = True
    measure_peaks: bool = True  # one-time measured copy bandwidth and matmul rate per device
    report_dir: str = ""  # where the raw ncu report and CSV are copied (a run directory); empty: the cache

    def validate(self) -> None:
        if self.max_kernels < 1 or self.forward_runs < 1:
            raise ValueError("profile max_kernels and forward_runs must be at least 1")


@dataclass
class BuildConfig:
    """How candidates' extensions are built (the build cache itself is always on).

    `use_pch`: load_inline calls with torch's default C++ flags use torch's precompiled
    <torch/extension.h> (built once per machine, under a lock). `max_jobs`: ninja's parallelism
    (MAX_JOBS); 0 means one job per CPU core. `lean_headers`: a load_inline's CUDA sources are
    built first with lean torch headers in place of <torch/types.h> / <torch/extension.h>
    (engine/child/lean_headers.py; about 3.5x faster on an H100 machine), and as written when
    that build fails.
    """

    use_pch: bool = True
    # C++-only load_inline calls with their own simple flags (-O3, -march=native, ...): a precompiled
    # <torch/extension.h> per flag set, made by the trusted builder at the set's second build and kept
    # in the build cache (engine/child/flag_pch.py; 0.8 GB each with torch 2.13); at most this many, 0: none
    flag_pch_keep: int = 3
    max_jobs: int = 0
    lean_headers: bool = True
    # The trusted build cache (docs/SANDBOX.md): the candidate's statically known load_inline calls
    # are built by a child that runs no candidate code, the evaluation loads only artefacts whose
    # sha256 that side recorded, and builds anything else privately. False: the evaluation builds
    # into the shared cache itself (faster by one child start-up; a candidate can poison the cache).
    trusted_cache: bool = True


# ---- the forge loop (Coder + Judge rounds) --------------------------------------------------

KernelBackend = Literal["cuda", "triton", "cpp"]


@dataclass
class RetryPolicy:
    """Retries of one model call on rate limits (429), server errors (5xx) and time-outs."""

    max_attempts: int = 5  # the first try included
    base_delay_s: float = 1.0  # wait before retry n: base * 2**(n-1), capped
    max_delay_s: float = 60.0
    request_timeout_s: float = 600.0  # one HTTP request, end to end


@dataclass
class ModelConfig:
    """How the Coder and the Judge reach their models (see `kernelwright.models.resolve_model`)."""

    coder: str | None = None  # the Coder's model spec (openai:MODEL, anthropic:MODEL, replay:RUN_DIR, a bare name)
    judge: str | None = None  # the Judge's model spec (None: the Coder's)
    base_url: str | None = None  # an OpenAI-compatible endpoint (vLLM, SGLang, Ollama, a proxy)
    api_key_env: str | None = None  # name of the env var holding the key (default: the provider's own)
    temperature: float | None = None  # None: the provider's default
    max_output_tokens: int | None = None  # None: the provider's default (Anthropic needs one: 16000)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    price_file: str | None = None  # JSON or TOML price table that extends the built-in one
    max_concurrent: int = 8  # calls in flight at once per endpoint (models.limits), all roles together
    # prices in the settings file itself: {model: {"input": USD/Mtok, "output": USD/Mtok}}, over the file's
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    # a folder of .j2 files that replace the bundled prompt templates of the same name (coder_first.j2,
    # llm_judge_performance.j2, _backend.j2, ...); the others stay the bundled ones (models/prompts)
    prompt_dir: str | None = None


@dataclass
class LoopConfig:
    """The forge loop: rounds, stop conditions and budgets. A budget left at None is unlimited."""

    rounds: int = 10
    # Coder answers per round (best-of-k): all are evaluated (concurrently, through an executor),
    # the Judge reviews the best correct one, or the failure that got furthest.
    candidates: int = 1
    backend: KernelBackend = "cuda"  # which Coder prompt variant: CUDA C++, Triton, or CPU C++
    target_speedup: float | None = None  # stop once the best verified candidate reaches it
    max_tokens: int | None = None  # all calls of the run, prompt and completion
    max_cost_usd: float | None = None  # calls with a known price only
    max_wall_s: float | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    profile: bool = True  # profile every correct candidate for the Judge (sets the evaluation's profile.enabled)
    # A correct candidate replaces the best only when it is clearly faster (loop.improvement): its
    # speedup is at least (1 + min_improvement) times the best's, AND its timing band sits above the
    # best's: speedup x median/p90 (its slow end) beats the best's speedup x median/p10 (the best's
    # fast end), each band's width scaled by spread_factor (0 turns the spread test off).
    min_improvement: float = 0.02
    spread_factor: float = 1.0
    # The Judge's expected speedup "held" when the next measured speedup over the candidate it
    # reviewed reaches expected x (1 - expectation_tolerance); above expected x (1 + tolerance): exceeded.
    expectation_tolerance: float = 0.1

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the fix."""
        check_values(self)
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1 (got {self.rounds})")
        if self.candidates < 1:
            raise ValueError(f"--candidates must be at least 1 (got {self.candidates})")
        if self.target_speedup is not None and self.target_speedup <= 0:
            raise ValueError(f"--target-speedup must be positive (got {self.target_speedup})")
        if self.model.retry.max_attempts < 1:
            raise ValueError("retry.max_attempts must be at least 1")
        if self.min_improvement < 0 or self.spread_factor < 0:
            raise ValueError("min_improvement and spread_factor must be non-negative")
        if not 0 <= self.expectation_tolerance < 1:
            raise ValueError(f"expectation_tolerance must be in [0, 1) (got {self.expectation_tolerance})")


# ---- the evaluation server (`kernelwright serve`, started by `kernelwright eval` where asked) --------

ServeAutostart = Literal["cuda", "always", "never"]


def _autostart_default() -> ServeAutostart:
    """`KERNELWRIGHT_SERVE_AUTOSTART` overrides the default (the test suite sets `never`: a test's eval
    must not leave a server behind)."""
    env = os.environ.get("KERNELWRIGHT_SERVE_AUTOSTART", "cuda")
    return env if env in ("cuda", "always", "never") else "cuda"  # type: ignore[return-value]


@dataclass
class ServeConfig:
    """The server of warm evaluations (`executors/eval_server.py`). A `kernelwright eval` that found
    none for its device starts one after its own evaluation (`autostart`: on a GPU by default, where
    a fresh runner and judge cost most), so the next eval of this user skips their start-up; it stops
    after `idle_minutes` without a job (`kernelwright serve --stop` at once; `eval --no-server`: never)."""

    autostart: ServeAutostart = field(default_factory=_autostart_default)
    idle_minutes: float = 10.0  # a started server's own; `kernelwright serve` in a terminal: 30
    spares: int = 2  # evaluations kept started up ahead of their jobs

    def validate(self) -> None:
        if self.spares < 1:
            raise ValueError(f"serve.spares must be at least 1 (got {self.spares})")
        if self.idle_minutes <= 0:
            raise ValueError(f"serve.idle_minutes must be more than 0 (got {self.idle_minutes})")


@dataclass
class Settings:
    """Everything one command runs with: the evaluation and the loop (with its models).

    Built in three layers, each overriding the one before: these dataclasses' defaults, the
    settings file (`kernelwright.toml`, or `[tool.kernelwright]` in `pyproject.toml`; see
    `core/settings_file.py`), and the options given on the command line.
    """

    eval: EvalConfig = field(default_factory=EvalConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    source: str | None = None  # the settings file read, if any
    explicit: set[str] = field(default_factory=set)  # "section.key" set by the file or the command line

    def given(self, key: str) -> bool:
        """Was `key` ("loop.backend", "eval.device", ...) set by the file or the command line?"""
        return key in self.explicit

    def validate(self) -> None:
        self.eval.validate()
        self.loop.validate()
        self.serve.validate()


# ---- reading and checking a configuration, derived from its dataclasses' fields ---------------

_Config = TypeVar("_Config")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _choices(values: tuple[Any, ...]) -> str:
    """('auto', 'cuda', 'cpu') -> 'auto, cuda or cpu'."""
    names = [str(v) for v in values]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def build(cls: type[_Config], data: dict[str, Any], where: str = "") -> _Config:
    """`cls` from a plain table (JSON or TOML): each value checked against its field's type (see
    `coerce`), nested tables built into their dataclasses; an unknown key is a ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"'{where}' must be a table of {cls.__name__}'s fields (got {data!r})")
    hints, names = _hints(cls), _field_names(cls)
    for key in data:
        if key not in names:
            raise ValueError(f"unknown key '{_dotted(where, key)}'; known: {', '.join(names)}")
    return cls(**{k: coerce(v, hints[k], _dotted(where, k)) for k, v in data.items()})


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` for a field of type `hint`: checked, and converted where JSON and TOML are narrower
    (a list for a tuple, an int for a float, a table for a dataclass). ValueError naming `key` and
    what it must be (a Literal's values) otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ValueError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise ValueError(f"'{key}' must be {_choices(args)} (got {value!r})")
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else build(hint, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"'{key}' must be a list of strings (got {value!r})")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"'{key}' must be a table (got {value!r})")
        return dict(value)
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ValueError(f"'{key}' must be {getattr(hint, '__name__', str(hint))} (got {value!r})")
    return value


def check_values(obj: Any, where: str = "") -> None:
    """Every field of `obj` whose type is a Literal (optional or not) holds one of its values, nested
    dataclasses included. ValueError: a top-level field is named as the command line's option
    (`--sandbox`), a nested one by its key (`profile.tool`)."""
    hints = _hints(type(obj))
    for name in _field_names(type(obj)):
        value, hint = getattr(obj, name), hints[name]
        if dataclasses.is_dataclass(value):
            check_values(value, _dotted(where, name))
            continue
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            if value is None:
                continue
            literals = [a for a in args if typing.get_origin(a) is Literal]
            args = typing.get_args(literals[0]) if literals else ()
        elif typing.get_origin(hint) is not Literal:
            continue
        if args and value not in args:
            label = _dotted(where, name) if where else "--" + name.replace("_", "-")
            raise ValueError(f"{label} must be {_choices(args)} (got {value!r})")
