"""The judge: computes the reference, the float64 oracle and the verdict; never imports candidate code.

`python -m kernelwright.engine.child.judge JOB.json` (or `--spare JOB.json`). It loads the
problem, constructs the reference for the evaluation's seed, and then follows the runner's
reports as the parent forwards them on stdin (`{"cmd": "runner", "msg": {...}}`), reading the
candidate's outputs from the runner's files as plain data (`wire.read_tree`: exact tensors,
checked sizes, no code). Everything the runner says is a claim: outputs are judged against the
judge's own reference on its own inputs; facts the runner reports (patched functions, kernels,
threads, timings) can only be turned into flags, never into a pass. The judge asks the parent
to let the runner proceed (`time`), to ablate (`ablate T`) or to stop it, and sends the one
typed record (`EvalResult`) at the end. Imports only torch, the standard library and `core`.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import faulthandler  # noqa: E402
import json
import os
import statistics
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernelwright.core.config import EvalConfig
from kernelwright.core.record import (
    CompileIssue,  # noqa: F401
    EvalResult,
    Stage,
    Status,
    TrialRecord,
)
from kernelwright.engine.child import heap
from kernelwright.engine.child.channel import Channel

GUARD_CALLS = 4  # the guards' two calls of the candidate, counted twice: one runs traced (slower)

if TYPE_CHECKING:
    import socket

    import torch

    from kernelwright.engine.child.numerics import NumericsReport


class HandoffUnavailable(RuntimeError):
    """A device output could not be received and the judge's own import of device memory failed
    its self-test at start-up: the machine's fault (an engine error), never the candidate's."""


class ReferenceFailure(Exception):
    """The reference problem itself failed (its get_inputs or its forward): the problem's fault."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log


# Looked up with whatever value the runner sent (any JSON value): keyed by object.
_FAILURE_STATUSES: dict[object, Status] = {
    "compile_error": Status.COMPILE_ERROR,
    "runtime_error": Status.RUNTIME_ERROR,
    "format_error": Status.FORMAT_ERROR,
    "engine_error": Status.ENGINE_ERROR,
}
_STAGES: dict[object, Stage] = {s.value: s for s in Stage}
_STAGE_KEY = {
    "startup": "startup_s",
    "build": "build_s",
    "init": "init_s",
    "correctness": "correctness_s",
    "timing": "timing_s",
    "profile": "profile_s",
}
MAX_TEXT = 20_000


def _text(v: Any, limit: int = MAX_TEXT) -> str:
    return str(v)[:limit] if v is not None else ""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _dict_field(msg: dict[str, Any], key: str) -> dict[Any, Any]:
    """`msg[key]` when it is a dict, else an empty one."""
    v = msg.get(key)
    return v if isinstance(v, dict) else {}


def bounded_cache(cache: dict[int, Any], budget_bytes: int, most: int = 9) -> dict[int, Any]:
    """`cache` (oldest first) without its oldest entries, until it holds at most `most` entries
    and `budget_bytes` of tensors; the newest entry is always kept."""
    from kernelwright.engine.child.compare import tensor_bytes

    keys = list(cache)
    sizes = {k: tensor_bytes(cache[k]) for k in keys}
    while len(keys) > 1 and (len(keys) > most or sum(sizes[k] for k in keys) > budget_bytes):
        keys.pop(0)
    return {k: cache[k] for k in keys}


def _memory_bytes(device: Any) -> int:
    """The device's memory (a CUDA device's total; the machine's RAM for the CPU)."""
    import torch

    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory)
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, RuntimeError, AttributeError):
        return 8 << 30


def _plain_data(v: Any, depth: int = 0) -> Any:
    """A copy of untrusted JSON data with bounded depth and string sizes."""
    if depth > 8:
        return None
    if isinstance(v, dict):
        return {str(k)[:200]: _plain_data(x, depth + 1) for k, x in list(v.items())[:500]}
    if isinstance(v, list):
        return [_plain_data(x, depth + 1) for x in v[:2000]]
    if isinstance(v, str):
        return v[:MAX_TEXT]
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return str(v)[:200]


ANCHOR_PROBE_S = 20.0  # how long the judge waits at start-up for its probe, to measure the hand-over


class Judge:
    def __init__(self, job: dict[str, Any], chan: Channel, handoff_fd: int | None = None):
        self.chan = chan
        self.take(job)
        self.started = False
        self._warming: threading.Thread | None = None  # the flop counter's first use, off the path
        self.handoff: socket.socket | None = None  # the socket on which the runner's device outputs arrive
        self.handoff_s = 0.0
        self.handoff_self_test = ""  # why this process could not import its own export ('' when it could)
        self.anchor: Any = None  # device_clock.Anchor: the hand-over to another process before any candidate ran
        self.device_clock_off = ""  # why the device clock is not used ('' when it is, or on the CPU)
        if handoff_fd is not None:
            import socket

            self.handoff = socket.socket(fileno=handoff_fd)

    def take(self, raw: dict[str, Any]) -> None:
        from kernelwright.engine.child.protocol import JudgeJob

        job = self.job = JudgeJob.from_json(raw)
        self.cfg = EvalConfig.from_dict(job.config) if "seed" in job.config else EvalConfig(device=job.config["device"])
        self.out_dir = job.out_dir or os.getcwd()
        self.rec = EvalResult(status=Status.RUNTIME_ERROR, atol=self.cfg.atol, rtol=self.cfg.rtol, seed=self.cfg.seed)
        self.rec.metadata = {}
        # Every input the candidate is judged on derives from this secret, drawn fresh for each
        # evaluation and never sent anywhere: the runner gets the inputs themselves, as data.
        # (`seed` stays the public seed of the models' weights, which both sides must share.)
        self.secret = int.from_bytes(os.urandom(6), "little")
        self.input_files: dict[int, str] = {}  # seed -> the wire file the runner reads its inputs from
        self.expected: set[str] = set()  # labels of outputs the runner still owes
        self.checks_done = False
        self.worst_errors = (0.0, 0.0)  # (normwise, element / scale) of the passed trials against the reference
        self.stage_started: dict[str, float] = {}
        self.current_stage = "startup"
        self.reported: Any = None  # the first failure reported (verdict.Failure); decide() weighs it at the end
        self.checks_passed = False  # every trial and the guards' calls right (set once every report is in)
        self.first_failure: tuple[int, int, str] | None = None
        self.flags: dict[str, str] = {}
        self.checked: list[str] = []
        self.facts: dict[str, Any] = {}
        self.oracle = None
        self.oracle_error = ""
        self.ref_cache: dict[int, tuple[Any, Any, Any]] = {}  # seed -> (reference output, oracle output, inputs)
        self.ref_call_s: list[float] = []  # the reference's own time for each call the judge made of it
        self.verified: dict[int, Any] = {}  # seed -> a candidate output judged correct for its inputs
        from kernelwright.engine.child.degenerate import DegenerateDetector

        self.degenerate = DegenerateDetector()  # does the reference depend on its input?
        self.ablation_asked = False
        self.ablation_lines: list[str] = []
        self.shape_plan: Any = None  # other sizes of the problem (shapes.py), once planned
        self.shape_results: dict[str, dict[str, Any]] = {}  # label -> what happened there
        self.timing_asked = False
        self.done = False
        self.busy_s: dict[str, float] = {}
        self.numerics: dict[str, float | str | bool | None] = {
            "verdict": self.cfg.verdict,
            "oracle": self.cfg.numerics.oracle,
            "oracle_dtype": self.cfg.numerics.oracle_dtype,
            "factor": self.cfg.numerics.factor,
            "excess_floor": self.cfg.numerics.excess_floor,
            "excess_floor_low": self.cfg.numerics.excess_floor_low,
            "ill_conditioned": False,
            "strict_passed": True,
            "calibrated_passed": True,
        }

    # ---- set-up (trusted code only) -------------------------------------------------------------
    def startup(self) -> None:
        import torch  # noqa: F401

        from kernelwright.engine.child import compare, degenerate, localize, numerics, wire  # noqa: F401
        from kernelwright.engine.child.problem_io import torch_device

        self.device = torch_device(self.cfg.device)
        if self.device.type == "cuda":
            if self.cfg.timing.probe:  # its start-up (a second CUDA context) overlaps this one's and the runner's build
                from kernelwright.engine.child import probe

                probe.start(self.device)
            for dtype in (torch.float32, torch.float64):  # the context and cuBLAS's handles, before any job comes
                x = torch.ones(8, 8, device=self.device, dtype=dtype)
                (x @ x).sum().item()
            if self.handoff is not None:  # the driver's calls for the runner's device outputs, loaded now
                from kernelwright.engine.child import device_handoff

                self.handoff_self_test = device_handoff.self_test(self.device)
            self.measure_anchor()
        self.started = True

    def measure_anchor(self) -> None:
        """The device clock's yardstick, taken before any candidate code has run (device_clock.Anchor):
        the two context switches of the probe's empty windows, the cap of what a window may take off
        for them. None where the driver cannot order streams on a flag (the wall clock stands)."""
        from kernelwright.engine.child import device_clock

        if not (self.cfg.timing.device_clock and self.handoff is not None):
            self.device_clock_off = "timing.device_clock is off" if self.handoff is not None else "no window socket"
            return
        why = device_clock.self_test(self.device)
        if why:
            self.device_clock_off = why
            return
        self.anchor = device_clock.Anchor()
        from kernelwright.engine.child import timing_review

        cal = device_clock.Calibration(anchor=None)
        deadline = self.cfg.timing.window_deadline_s
        pt, _ = timing_review.switch_timer(self, cal, lambda s: deadline, windows_first=5, wait_s=ANCHOR_PROBE_S)
        if pt is not None:
            timing_review.release_probe(pt)
        self.anchor.switch_ms = cal.switch

    def warm_in_background(self) -> None:
        """The FLOP counter's first use (the physics check counts the reference's work with it)
        imports torch._dynamo: 3-5 s, once per process, at the end of every evaluation of a new
        problem. Started here, in a thread, while the job and the runner's build are on their way;
        the timing stage waits for it (`warmed`) so that no import runs beside a timing window."""
        if self._warming is not None:
            return

        def warm() -> None:
            try:
                import torch
                from torch.utils.flop_counter import FlopCounterMode

                with torch.no_grad(), FlopCounterMode(display=False):
                    torch.ones(2, 2) @ torch.ones(2, 2)
            except Exception:
                pass

        self._warming = threading.Thread(target=warm, name="kw-warm-flop-counter", daemon=True)
        self._warming.start()

    def warmed(self, timeout_s: float = 60.0) -> None:
        if self._warming is not None:
            self._warming.join(timeout_s)

    def load_problem(self) -> bool:
        import torch

        from kernelwright.engine.child.problem_io import ProblemIO, load_source

        try:
            self.problem = load_source(self.job.problem_source, self.job.problem_name, "kw_problem")
            self.io = ProblemIO(self.problem, self.device, self.cfg.inputs_on_device, self.rec.metadata)
            self.ref_model = self.io.construct(self.problem.Model, self.cfg.seed)
            torch.manual_seed(self.cfg.seed)
            self.init_inputs = self.problem.get_init_inputs()
        except Exception as exc:
            self.set_verdict(
                Status.RUNTIME_ERROR,
                "The reference problem failed to load or construct:\n" + _short_tb(exc),
                Stage.REFERENCE,
            )
            return False
        return True

    # ---- the record --------------------------------------------------------------------------------
    def set_verdict(self, status: Status, log: str, stage: Stage | None) -> None:
        """Report a failure. The first one reported is kept; `verdict.decide` weighs it against the
        other facts at the end (a timeout or a crash of the runner, say, comes first)."""
        from kernelwright.engine.child.verdict import Failure

        if self.reported is None:
            self.reported = Failure(status, log, stage)

    @property
    def verdict_set(self) -> bool:
        return self.reported is not None

    def ask(self, what: str) -> None:
        self.chan.send("ask", what=what)

    def reference(self, seed: int) -> tuple[Any, Any, Any]:
        """(reference output, oracle output or None, the inputs): the judge's own, for `seed`."""
        import torch

        from kernelwright.engine.child import numerics
        from kernelwright.engine.child.problem_io import sync
        from kernelwright.engine.child.trees import clone

        if seed in self.ref_cache:
            return self.ref_cache[seed]
        for attempt in (0, 1):
            try:
                inputs = self.io.inputs(seed)
                args = clone(inputs)
                sync(self.device)
                t0 = time.perf_counter()
                with torch.no_grad():
                    ref_out = self.ref_model(*args)
                sync(self.device)
                self.ref_call_s.append(time.perf_counter() - t0)
                break
            except torch.OutOfMemoryError as exc:
                # what the judge keeps of earlier seeds is the first to go (a problem whose outputs
                # take gigabytes: the device ran out with the cache full)
                if attempt or not self.ref_cache:
                    raise ReferenceFailure(_short_tb(exc)) from exc
                inputs = args = None
                self.ref_cache = {}
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            except Exception as exc:
                raise ReferenceFailure(_short_tb(exc)) from exc
        oracle_out = None
        if self.cfg.numerics.oracle and not self.oracle_error:
            try:
                dtype = numerics.oracle_dtype(self.cfg.numerics.oracle_dtype)
                if self.oracle is None:
                    self.oracle = numerics.build_oracle(self.ref_model, dtype)
                oracle_out = numerics.run_oracle(self.oracle, inputs, dtype)
                sync(self.device)
            except Exception as exc:
                self.oracle_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        # at most 9 seeds, and at most a sixth of the device's memory (one seed's outputs and their
        # float64 oracle can take gigabytes)
        self.ref_cache = bounded_cache(
            {**self.ref_cache, seed: (ref_out, oracle_out, inputs)}, _memory_bytes(self.device) // 6
        )
        from kernelwright.engine.child.compare import tensor_bytes

        self.largest_bytes = max(getattr(self, "largest_bytes", 0), tensor_bytes((ref_out, inputs)))
        return ref_out, oracle_out, inputs

    def read(self, name: Any) -> Any:
        from kernelwright.engine.child.wire import read_tree

        if not isinstance(name, str) or "/" in name or name.startswith("."):
            from kernelwright.engine.child.wire import WireError

            raise WireError("the runner named an output file outside its directory")
        # an output file is never much larger than what the reference returns and takes: a bound
        # keeps a candidate from making the judge read gigabytes it wrote on purpose
        limit = 4 * getattr(self, "largest_bytes", 0) + (64 << 20)
        path = os.path.join(self.out_dir, name)
        spill = self.job.spill_dir
        if spill and not os.path.lexists(path):  # the runner spilled it to the disk (memory full)
            path = os.path.join(spill, name)
        try:
            return read_tree(path, self.device, max_bytes=limit, fetch=self.fetcher(name))
        finally:
            try:  # read once: its memory (the output directory may be a tmpfs) is freed now
                os.unlink(path)
            except OSError:
                pass

    def fetcher(self, name: str) -> Callable[[int, int], torch.Tensor] | None:
        """Leaf i's bytes of output `name`, sent by the runner on the device (`device_handoff`)."""
        handoff = self.handoff
        if handoff is None or self.device.type != "cuda" or not self.cfg.device_handoff:
            return None
        from kernelwright.engine.child import device_handoff
        from kernelwright.engine.child.wire import WireError

        def fetch(i: int, nbytes: int) -> torch.Tensor:
            t0 = time.monotonic()
            try:
                return device_handoff.receive(handoff, f"{name}#{i}#{nbytes}", nbytes, self.device)
            except (device_handoff.HandoffError, device_handoff.Unavailable) as exc:
                if self.handoff_self_test:  # the judge's own side is broken: not the candidate's fault
                    raise HandoffUnavailable(
                        f"the judge cannot import device outputs on this machine ({self.handoff_self_test}); "
                        f"this output failed with: {exc}; "
                        "set `device_handoff = false` under [eval] in kernelwright.toml"
                    ) from None
                raise WireError(str(exc)) from None
            finally:
                self.handoff_s += time.monotonic() - t0

        return fetch

    def compare(self, cand: Any, ref_out: Any, oracle_out: Any, localize: bool) -> tuple[bool, str, dict[str, Any]]:
        """(passed, message, numerics evidence) under the configured verdict mode."""
        from kernelwright.engine.child import numerics
        from kernelwright.engine.child.compare import compare_outputs, structure_mismatch

        mismatch = structure_mismatch(cand, ref_out)
        if mismatch:
            return False, mismatch, {"strict_passed": False, "_report": (None, None)}
        strict = compare_outputs(cand, ref_out, self.cfg.atol, self.cfg.rtol)
        rep = None
        if oracle_out is not None:
            rep = numerics.judge(
                cand,
                ref_out,
                oracle_out,
                self.cfg.atol,
                self.cfg.rtol,
                self.cfg.numerics.factor,
                excess_floor=self.cfg.numerics.excess_floor,  # element-by-element test
                excess_floor_low=self.cfg.numerics.excess_floor_low,
            )
        evidence: dict[str, Any] = {"strict_passed": strict.passed}
        if rep is not None and rep.ok:
            evidence.update(rep.to_dict())
            evidence["calibrated_passed"] = rep.passed
        use_cal = self.cfg.verdict == "calibrated" and rep is not None and rep.ok and strict.max_abs_err is not None
        cal = rep if use_cal else None  # the report the verdict follows, when calibrated
        if cal is not None:
            passed, message = cal.passed, cal.message
            structural = [leaf for leaf in strict.leaves if not leaf.passed and leaf.max_abs_err is None]
            if structural:
                passed, message = False, strict.message
        else:
            passed, message = strict.passed, strict.message
        evidence["_report"] = (strict, cal)
        if not passed and self.cfg.numerics.localize and localize:
            message = self.localize(message, cand, oracle_out if cal is not None else ref_out, cal)
        return passed, message, evidence

    def localize(self, message: str, cand: Any, target: Any, rep: NumericsReport | None) -> str:
        import torch

        from kernelwright.engine.child import localize, numerics
        from kernelwright.engine.child.compare import flatten

        extra = []
        nan_fill = self.cfg.guards.enabled and self.cfg.guards.nan_fill
        for (name, c), (_, t) in zip(flatten(cand), flatten(target), strict=False):
            if not (isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor)) or c.shape != t.shape:
                continue
            if not (t.is_floating_point() or t.is_complex()):
                continue
            try:
                # calibrated: the tolerance its verdict applied (rtol raised to the output dtype's ulp)
                rtol = self.cfg.rtol if rep is None else numerics.resolution_rtol(c.dtype, self.cfg.rtol)
                lines = localize.localize(c, t, self.cfg.atol, rtol, name, nan_filled=nan_fill)
            except Exception as exc:
                lines = [f"(localisation failed: {type(exc).__name__}: {str(exc)[:200]})"]
            if lines and nan_fill and any("never written" in ln for ln in lines):
                self.flag("unwritten_output", f"{name} holds NaN where memory was filled with NaN before ModelNew ran")
            if rep is not None:
                for leaf in rep.failing():
                    if leaf.name == name and numerics.lower_precision_suspected(t, leaf.candidate, c.dtype):
                        self.flag(
                            "lower_precision_suspected",
                            f"{name}'s normwise error {leaf.candidate.norm_rel:.2e} "
                            "is at the level of bf16/fp16 rounding",
                        )
                        lines.append(
                            "the error is at the level of bf16/fp16 rounding: lower precision than the problem's dtype?"
                        )
            extra += [f"  where: {ln}" for ln in lines]
        return message + ("\n" + "\n".join(extra) if extra else "")

    def flag(self, name: str, detail: str) -> None:
        self.flags.setdefault(name, detail[:2000])

    # ---- the runner's reports ------------------------------------------------------------------------
    def on_runner(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if not isinstance(kind, str):
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            return
        t0 = time.perf_counter()
        try:
            handler(self, msg)
        except ReferenceFailure as exc:  # the problem's own fault
            self.set_verdict(Status.RUNTIME_ERROR, "The reference Model failed to run:\n" + exc.log, Stage.REFERENCE)
            self.ask("stop")
        finally:  # the judge's own time per kind of report (metadata["judge_busy_s"])
            self.busy_s[kind] = self.busy_s.get(kind, 0.0) + time.perf_counter() - t0

    def r_prestarted(self, msg: dict[str, Any]) -> None:
        self.rec.metadata["prestarted"] = {"idle_s": _num(msg.get("idle_s")), "startup_s": _num(msg.get("startup_s"))}

    def r_stage(self, msg: dict[str, Any]) -> None:
        stage = msg.get("stage")
        if isinstance(stage, str) and stage in _STAGE_KEY:
            self.enter_stage(stage)

    def enter_stage(self, stage: str) -> None:
        """Close the current stage's span and open `stage`'s. A stage entered twice (correctness,
        then timing in this process, then correctness again at other sizes) adds its spans up."""
        self.close_stage()
        self.stage_started[stage] = time.monotonic()
        self.current_stage = stage

    def close_stage(self) -> None:
        prev = self.current_stage
        started = self.stage_started.pop(prev, None)
        if started is not None and prev in _STAGE_KEY:
            key = _STAGE_KEY[prev]
            before = getattr(self.rec.stage_times, key) or 0.0
            setattr(self.rec.stage_times, key, before + time.monotonic() - started)

    def r_startup(self, msg: dict[str, Any]) -> None:
        self.rec.device = _text(msg.get("device"), 200)
        self.rec.device_type = self.device.type
        self.rec.stage_times.startup_s = _num(msg.get("startup_s"))
        self.rec.metadata.update(
            torch_version=_text(msg.get("torch_version"), 50),
            cuda_version=_text(msg.get("cuda_version"), 50),
            python=_text(msg.get("python"), 50),
        )

    def r_build(self, msg: dict[str, Any]) -> None:
        self.rec.metadata["builds"] = _plain_data(msg.get("builds") or [])

    def r_compiled(self, msg: dict[str, Any]) -> None:
        """The candidate imported: send every check at once (the runner answers in order)."""
        from kernelwright.engine.child import protocol
        from kernelwright.engine.child.problem_io import guard_seeds, trial_seed

        self.rec.compiled = True
        init = self.write_inputs("in_init.kwt", self.init_inputs)
        cmds: list[Any] = [protocol.Construct(init=init, seed=self.cfg.seed)]
        for t in range(self.cfg.trials):
            seed = trial_seed(self.secret, t)
            cmds.append(protocol.Call(label=f"trial{t}", inputs=self.inputs_file(seed)))
            self.expected.add(f"trial{t}")
        if self.cfg.guards.enabled:
            seeds = guard_seeds(self.secret)
            refill = self.inputs_file(seeds["refill"]) if self.cfg.guards.refill_inputs else ""
            cmds.append(protocol.Guards(inputs=self.inputs_file(seeds["call"]), refill=refill))
            self.expected.add("guards")
        for c in cmds:
            self.ask(protocol.to_line(c))
        self.limit_correctness(calls=GUARD_CALLS if self.cfg.guards.enabled else 1)

    def limit_correctness(self, calls: int) -> None:
        """The most time a correctness command of the runner (a trial: one call; the guards: `calls`)
        may take before its report, from the reference's own time (StageTimeouts.call_floor,
        call_factor; jit_allowance before the first report of a candidate that compiles at its first
        call): a kernel that never returns is stopped within seconds, not at the stage's flat limit."""
        t = self.cfg.timeouts
        if t.call_factor <= 0 or not self.ref_call_s:
            return
        per_call = statistics.median(self.ref_call_s[1:] or self.ref_call_s)  # the first call warms up
        limit = min(max(t.call_floor, t.call_factor * per_call * calls), t.correctness)
        first = t.jit_allowance if self.job.candidate_jit else 0.0
        self.rec.metadata["correctness_limit_s"] = round(limit, 3)
        if first:
            self.rec.metadata["correctness_first_call_extra_s"] = first
        self.chan.send("limit", stage="correctness", s=limit, first_extra_s=first)

    def write_inputs(self, name: str, obj: Any) -> str:
        from kernelwright.engine.child.wire import write_tree

        path = os.path.join(self.out_dir, name)
        try:
            os.unlink(path)  # whatever stands there was not written by this judge
        except FileNotFoundError:
            pass
        write_tree(path, obj)
        return name

    def inputs_file(self, seed: int) -> str:
        """The wire file holding the judge's inputs for `seed` (written once)."""
        if seed not in self.input_files:
            _, _, inputs = self.reference(seed)
            self.input_files[seed] = self.write_inputs(f"in_{len(self.input_files):03d}.kwt", inputs)
        return self.input_files[seed]

    def r_failure(self, msg: dict[str, Any]) -> None:
        status = _FAILURE_STATUSES.get(msg.get("status"), Status.RUNTIME_ERROR)
        if msg.get("caught") is True:
            self.rec.metadata["build_failure_caught"] = True
        if isinstance(msg.get("engine_traceback"), str):
            self.rec.metadata["engine_traceback"] = _text(msg["engine_traceback"])
        stage = _STAGES.get(msg.get("stage"), None)
        issues = []
        for i in (msg.get("compile_issues") or [])[:50]:
            if isinstance(i, dict):
                try:
                    issues.append(
                        CompileIssue(
                            **{k: _plain_data(v) for k, v in i.items() if k in CompileIssue.__dataclass_fields__}
                        )
                    )
                except TypeError:
                    pass
        if issues:
            self.rec.compile_issues = issues
        self.set_verdict(status, _text(msg.get("log")), stage)

    def r_call_error(self, msg: dict[str, Any]) -> None:
        label = msg.get("label")
        if isinstance(label, str) and label.startswith("shape") and msg.get("probe") is True:
            return self.shape_error(label, _text(msg.get("message"), 500), lost=msg.get("lost") is True)
        if isinstance(label, str) and label.startswith("trial") and label[5:].isdigit():
            from kernelwright.engine.child.problem_io import trial_seed

            t = int(label[5:])
            self.rec.trials.append(
                TrialRecord(
                    trial=t, seed=trial_seed(self.secret, t), passed=False, message=_text(msg.get("message"), 500)
                )
            )
        self.expected.clear()

    def r_output(self, msg: dict[str, Any]) -> None:
        label = msg.get("label")
        if isinstance(label, str) and label in self.expected and label.startswith("shape"):
            return self.shape_output(label, msg.get("file"))
        if not (isinstance(label, str) and label in self.expected and label.startswith("trial")):
            return
        self.expected.discard(label)
        self.trial(int(label[5:]), msg.get("file"))
        self.after_report()

    def trial(self, t: int, file: Any) -> None:
        from kernelwright.engine.child.problem_io import trial_seed
        from kernelwright.engine.child.wire import WireError

        seed = trial_seed(self.secret, t)
        ref_out, oracle_out, inputs = self.reference(seed)
        trial = TrialRecord(trial=t, seed=seed, passed=False)
        try:
            cand = self.read(file)
        except WireError as exc:
            trial.message = f"The candidate's output for trial {t} could not be read: {exc}"
            self.add_trial(trial)
            return
        first = self.first_failure is None
        passed, message, evidence = self.compare(cand, ref_out, oracle_out, localize=first)
        strict, rep = evidence.pop("_report")
        trial.passed, trial.message = passed, message
        trial.extra["numerics"] = evidence
        if strict is not None and strict.leaves:
            worst = strict.worst
            trial.max_abs_err, trial.mean_abs_err = strict.max_abs_err, strict.mean_abs_err
            trial.worst_index = worst.worst_index if worst else None
            trial.worst_output = worst.name if worst else None
            trial.frac_out_of_tol = max((leaf.frac_out_of_tol or 0.0) for leaf in strict.leaves)
        s = self.numerics
        s["strict_passed"] = s["strict_passed"] and evidence.get("strict_passed", False)
        if "calibrated_passed" in evidence:
            s["calibrated_passed"] = s["calibrated_passed"] and evidence["calibrated_passed"]
            s["ill_conditioned"] = s["ill_conditioned"] or evidence.get("ill_conditioned", False)
        else:
            s["calibrated_passed"] = None
        self.degenerate.add(inputs, ref_out)
        if passed:  # how far a correct output of this candidate strays: the bound for its timed outputs
            from kernelwright.engine.child.windows import errors

            e = errors(cand, ref_out)
            if e is not None:
                self.worst_errors = (max(self.worst_errors[0], e[0]), max(self.worst_errors[1], e[1]))
        self.add_trial(trial)

    def after_report(self) -> None:
        """Once every check's output is in: the verdict so far, then timing or the end."""
        if self.expected or self.checks_done:
            return
        self.checks_done = True
        if self.verdict_set or self.first_failure is not None:
            if self.cfg.numerics.localize and self.first_failure and not self.ablation_asked:
                self.ask_ablation()
            else:
                self.ask("stop")
            return
        if len([tr for tr in self.rec.trials if tr.passed]) < self.cfg.trials:
            self.set_verdict(
                Status.RUNTIME_ERROR,
                f"The runner reported fewer trials than were asked for ({len(self.rec.trials)}/{self.cfg.trials})",
                Stage.CORRECTNESS,
            )
            self.ask("stop")
            return
        self.checks_passed = True  # every output right: what is left to decide are the flags and the timing
        if self.failing_guards():
            self.ask("stop")
            return
        if self.cfg.time_candidate:
            self.timing_asked = True
            self.time_windows()
        if self.reported is None and (self.cfg.profile.enabled or self.cfg.profile.roofline):
            self.evidence()
            if self.cfg.profile.enabled:
                from kernelwright.engine.child import protocol
                from kernelwright.engine.child.problem_io import trial_seed

                self.expected.add("evidence")
                self.ask(protocol.to_line(protocol.Profile(inputs=self.inputs_file(trial_seed(self.secret, 0)))))
                return
        self.shapes_or_stop()

    def ask_ablation(self) -> None:
        """Which parameter, zeroed in both models, makes the first failure go away (evidence for
        the Judge model): the runner zeroes it in ModelNew, the judge in its own reference."""
        from kernelwright.engine.child import protocol

        self.ablation_asked = True
        assert self.first_failure is not None, "asked after a failed trial"
        t, seed, _ = self.first_failure
        names = [n for n, p in self.ref_model.named_parameters() if p.is_floating_point()][:8]
        if not names:
            self.ask("stop")
            return
        self.ablation_seed = seed
        self.expected.add("ablation")
        self.ask(protocol.to_line(protocol.Ablate(inputs=self.inputs_file(seed), params=names)))

    def add_trial(self, trial: TrialRecord) -> None:
        self.rec.trials.append(trial)
        if not trial.passed and self.first_failure is None:
            self.first_failure = (trial.trial, trial.seed, trial.message)

    def r_ablation(self, msg: dict[str, Any]) -> None:
        import torch

        from kernelwright.engine.child.compare import compare_outputs, flatten
        from kernelwright.engine.child.trees import clone
        from kernelwright.engine.child.wire import WireError

        if "ablation" not in self.expected:
            return
        self.expected.discard("ablation")
        files = _dict_field(msg, "files")
        params = dict(self.ref_model.named_parameters())
        _, _, inputs = self.reference(self.ablation_seed)
        for name, file in list(files.items())[:8]:
            p = params.get(name)
            if p is None:
                continue
            saved = p.detach().clone()
            try:
                cand = self.read(file)
                with torch.no_grad():
                    p.zero_()
                    ref_out = self.ref_model(*clone(inputs))
                rep = compare_outputs(cand, ref_out, self.cfg.atol, self.cfg.rtol)
                nonzero = any(
                    isinstance(x, torch.Tensor) and x.numel() and bool(x.ne(0).any()) for _, x in flatten(ref_out)
                )
                if rep.passed and nonzero:
                    self.ablation_lines.append(
                        f"the mismatch disappears when parameter '{_text(name, 100)}' is set "
                        f"to 0 in both models (outputs still non-zero): look at how "
                        f"'{_text(name, 100)}' is used"
                    )
            except (WireError, RuntimeError, ValueError):
                pass
            finally:
                with torch.no_grad():
                    p.copy_(saved)
        self.ask("stop")  # the verdict is known: nothing the runner does now can change it

    def r_patched(self, msg: dict[str, Any]) -> None:
        names = [_text(n, 120) for n in (msg.get("names") or [])[:50]]
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            self.flag(
                "patched_functions",
                f"the candidate replaced {shown} ({_text(msg.get('when'), 80)}); the originals were put back",
            )

    def r_guards(self, msg: dict[str, Any]) -> None:
        from kernelwright.engine.child import guards  # noqa: F401
        from kernelwright.engine.child.compare import flatten  # noqa: F401
        from kernelwright.engine.child.problem_io import guard_seeds  # noqa: F401
        from kernelwright.engine.child.wire import WireError  # noqa: F401

        if "guards" not in self.expected:
            return
        self.expected.discard("guards")
        try:
            self.guards_report(msg)
        finally:
            self.after_report()

    def guards_report(self, msg: dict[str, Any]) -> None:
        from kernelwright.engine.child import guards
        from kernelwright.engine.child.compare import flatten
        from kernelwright.engine.child.problem_io import guard_seeds
        from kernelwright.engine.child.wire import WireError

        self.checked += [
            "patched_functions",
            "calls_reference",
            "mutates_inputs",
            "output_aliases_input",
            "output_changed_later",
            "background_threads",
        ]
        facts = _dict_field(msg, "facts")
        files = _dict_field(msg, "files")
        self.facts["call"] = _plain_data({k: v for k, v in facts.items() if k != "aliases"})
        seeds = guard_seeds(self.secret)
        if facts.get("problem_code"):
            self.flag(
                "calls_reference",
                "code of the problem file ran inside ModelNew: "
                + ", ".join(_text(x, 100) for x in facts["problem_code"][:5]),
            )
        if self.cfg.guards.profile_kernels:
            self.checked.append("no_custom_kernel")
            if not facts.get("custom_kernel") and not facts.get("profiler_error"):
                self.flag(
                    "no_custom_kernel",
                    "ModelNew launched only PyTorch's built-in operations and kernels "
                    "(no extension function, Triton kernel or custom op of its own ran)",
                )
        ref_alias = self.reference_aliases(seeds["call"])
        for pair in (facts.get("aliases") or [])[:5]:
            if isinstance(pair, list) and len(pair) == 2 and pair[0] not in ref_alias:
                self.flag(
                    "output_aliases_input",
                    f"output {_text(pair[0], 80)} shares memory with input "
                    f"{_text(pair[1], 80).replace('out', 'inputs', 1)}",
                )
        if facts.get("threads"):
            names = ", ".join(_text(x, 60) for x in facts["threads"][:3])
            self.flag(
                "background_threads",
                f"ModelNew left Python thread(s) running ({names}): work that may escape the timer",
            )
        try:
            ref_out, oracle_out, inputs = self.reference(seeds["call"])
            out_a = self.read(files.get("out_a"))
            ok, message, _ = self.compare(out_a, ref_out, oracle_out, localize=False)
            if not ok and self.first_failure is None:
                self.set_verdict(
                    Status.INCORRECT,
                    f"ModelNew's output on a further input (seed {seeds['call']}) is wrong: " + message,
                    Stage.CORRECTNESS,
                )
            # inputs changed in place, beyond what the reference does to its own copy
            after = self.read(files.get("inputs_after"))
            ref_after = self.reference_inputs_after(seeds["call"])
            for (name, x), (_, rx) in zip(flatten(after), flatten(ref_after), strict=False):
                import torch

                if isinstance(x, torch.Tensor) and isinstance(rx, torch.Tensor) and not guards.same_values(x, rx):
                    self.flag("mutates_inputs", f"ModelNew changed input {name.replace('out', 'inputs', 1)} in place")
                    break
            if "out_refill" in files:
                self.checked.append("stale_output_on_refill")
                ref_b, oracle_b, _ = self.reference(seeds["refill"])
                out_b = self.read(files["out_refill"])
                ok, message, _ = self.compare(out_b, ref_b, oracle_b, localize=False)
                if not ok:
                    self.flag(
                        "stale_output_on_refill",
                        "inputs refilled in place with new values (same tensors, "
                        "same addresses) after correctness gave a wrong output: " + _first_line(message),
                    )
                again = self.read(files.get("out_a_again"))
                for (name, o), (_, o0) in zip(flatten(again), flatten(out_a), strict=False):
                    if (
                        isinstance(o, torch.Tensor)
                        and isinstance(o0, torch.Tensor)
                        and not guards.same_values(o, o0)
                        and "output_aliases_input" not in self.flags
                    ):
                        self.flag(
                            "output_changed_later",
                            f"output {name} of one call changed when ModelNew ran "
                            "again (it is a persistent buffer that later calls overwrite)",
                        )
                        break
        except WireError as exc:
            self.flag("guard_outputs_unreadable", f"the guarded calls' outputs could not be read: {exc}")

    def reference_inputs_after(self, seed: int) -> Any:
        """The inputs after the reference ran on them (a reference may legitimately change them)."""
        import torch

        inputs = self.io.inputs(seed)
        with torch.no_grad():
            self.ref_model(*inputs)
        return inputs

    def reference_aliases(self, seed: int) -> set[str]:
        """Names of the reference's outputs that share memory with its inputs (allowed to the candidate too)."""
        import torch

        from kernelwright.engine.child import guards
        from kernelwright.engine.child.trees import clone

        inputs = clone(self.reference(seed)[2])
        with torch.no_grad():
            out = self.ref_model(*inputs)
        keys = {guards.storage_key(x) for _, x in guards.tensors(inputs)}
        return {n for n, o in guards.tensors(out) if guards.storage_key(o) in keys}

    def failing_guards(self) -> list[str]:
        """The raised flags that fail the verdict (GuardConfig.fail_on)."""
        return [f for f in self.flags if f in self.cfg.guards.fail_on]

    def time_windows(self) -> None:
        from kernelwright.engine.child import timing_review

        t0 = time.perf_counter()
        back_to = self.current_stage
        self.enter_stage("timing")  # the runner no longer times: the timing stage is the judge's windows
        try:
            timing_review.run(self)
        finally:
            self.busy_s["timing_windows"] = self.busy_s.get("timing_windows", 0.0) + time.perf_counter() - t0
            self.enter_stage(back_to)

    def evidence(self) -> None:
        """Device facts, the reference's work and the roofline of the judge's own candidate time."""
        from kernelwright.core import roofline
        from kernelwright.engine.child import evidence, gpu_facts
        from kernelwright.engine.child.problem_io import trial_seed

        meta = self.rec.metadata
        try:
            facts = self.device_facts()
            meta["gpu_facts"] = facts
        except Exception as exc:
            meta["gpu_facts_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            facts = None
        if not self.cfg.profile.roofline:
            return
        try:
            _, _, inputs = self.reference(trial_seed(self.secret, 0))
            work = self.reference_work(inputs)
            meta["reference_work"] = work
            if facts is not None and self.rec.candidate_ms:
                peak_flops, peak_bw, source = roofline.choose_peaks(facts, work["precision"])
                if peak_bw:
                    r = roofline.compute(
                        work["flops"],
                        work["min_bytes"],
                        self.rec.candidate_ms,
                        peak_bw,
                        peak_flops,
                        source,
                        work["precision"],
                    )
                    meta["roofline"] = r.to_dict()
                    meta["roofline_line"] = roofline.line(r)
        except Exception as exc:
            meta["roofline_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        del evidence, gpu_facts

    def device_facts(self) -> dict[str, Any]:
        from kernelwright.engine.child import gpu_facts

        if getattr(self, "_facts", None) is None:
            self._facts = gpu_facts.collect(self.device, self.cfg.cache_dir, measure=self.cfg.profile.measure_peaks)
        return self._facts

    def reference_work(self, inputs: Any) -> dict[str, Any]:
        from kernelwright.engine.child import evidence

        if getattr(self, "_work", None) is None:
            self._work = evidence.cached_reference_work(
                self.ref_model,
                inputs,
                None,
                self.cfg.cache_dir,
                self.device,
                problem_text=self.job.problem_source,
            )
        return self._work

    def r_evidence(self, msg: dict[str, Any]) -> None:
        if "evidence" in self.expected:
            self.expected.discard("evidence")
            self.shapes_or_stop()
        meta = msg.get("metadata")
        if isinstance(meta, dict):
            for k, v in meta.items():
                if k in (
                    "gpu_facts",
                    "reference_work",
                    "roofline",
                    "roofline_line",
                    "profile",
                    "gpu_facts_error",
                    "roofline_error",
                    "profile_error",
                ):
                    self.rec.metadata[k] = _plain_data(v)

    def r_done(self, msg: dict[str, Any]) -> None:
        self.done = True

    # ---- other sizes of the problem (shapes.py) -------------------------------------------------------
    def shapes_or_stop(self) -> None:
        """The last checks of a passed candidate, then stop: one trial at each other size derived
        from the problem's constants (`EvalConfig.shapes`). They come after timing and evidence, so
        that a crash or a lost device at another size takes nothing the candidate earned at its own."""
        if self.cfg.shapes == "off":
            self.rec.metadata["shapes"] = {"mode": "off"}
        if (
            self.shape_plan is not None
            or self.cfg.shapes == "off"
            or not self.checks_passed
            or self.verdict_set
            or self.failing_guards()
        ):
            self.ask("stop")
            return
        from kernelwright.engine.child import protocol

        t0 = time.perf_counter()
        try:
            self.shape_plan = self.plan_shapes()
        except Exception as exc:  # the judge's own trouble with the problem: the verdict at its own size stands
            self.rec.metadata["shapes"] = {
                "mode": self.cfg.shapes,
                "note": f"the other sizes could not be derived: {type(exc).__name__}: {str(exc)[:300]}",
            }
            self.ask("stop")
            return
        finally:
            self.busy_s["shapes_plan"] = time.perf_counter() - t0
        self.checked.append("shape_specific")
        for v in self.shape_plan.variants:
            model = ""
            if v.init_changed:  # init sizes change: a new ModelNew, kept by the runner under this label
                init = self.write_inputs(f"in_{v.label}_init.kwt", v.init_inputs)
                self.ask(protocol.to_line(protocol.Construct(init=init, seed=self.cfg.seed, label=v.label)))
                model = v.label
            self.expected.add(v.label)
            inputs = self.write_inputs(f"in_{v.label}.kwt", v.inputs)
            v.inputs = None  # in the runner's file now; the judge keeps only the outputs it compares with
            self.ask(protocol.to_line(protocol.Call(label=v.label, inputs=inputs, model=model, probe=True)))
        self.shapes_after()

    def plan_shapes(self) -> Any:
        """The sizes the reference accepts, with its outputs there (shapes.derive)."""
        import torch

        from kernelwright.engine.child import numerics, shapes
        from kernelwright.engine.child.problem_io import sync, trial_seed
        from kernelwright.engine.child.trees import clone

        def forward(model: Any, inputs: Any) -> Any:
            with torch.no_grad():
                out = model(*clone(inputs))
            sync(self.device)
            return out

        def init() -> Any:
            torch.manual_seed(self.cfg.seed)
            return self.problem.get_init_inputs()

        def construct(init_inputs: Any) -> Any:
            torch.manual_seed(self.cfg.seed)
            return self.problem.Model(*init_inputs).to(self.device).eval()

        def oracle(model: Any, inputs: Any) -> Any:
            if not self.cfg.numerics.oracle or self.oracle_error:
                return None
            try:
                dtype = numerics.oracle_dtype(self.cfg.numerics.oracle_dtype)
                upcast = (
                    self.oracle
                    if model is self.ref_model and self.oracle is not None
                    else numerics.build_oracle(model, dtype)
                )
                out = numerics.run_oracle(upcast, inputs, dtype)
                sync(self.device)
                return out
            except Exception:  # judged against the reference alone there (strict)
                return None

        _, _, base_inputs = self.reference(trial_seed(self.secret, 0))
        seeds = [trial_seed(self.secret, 900 + i) for i in range(shapes.MAX_VARIANTS)]
        return shapes.derive(
            self.problem,
            base_model=self.ref_model,
            base_init=self.init_inputs,
            base_inputs=base_inputs,
            seeds=seeds,
            draw=self.io.inputs,
            init=init,
            construct=construct,
            forward=forward,
            oracle=oracle,
        )

    def shape_variant(self, label: str) -> Any:
        return next(v for v in self.shape_plan.variants if v.label == label)

    def shape_output(self, label: str, file: Any) -> None:
        from kernelwright.engine.child.wire import WireError

        self.expected.discard(label)
        v = self.shape_variant(label)
        try:
            cand = self.read(file)
        except WireError as exc:
            self.shape_results[label] = {
                "passed": False,
                "failure": "unreadable",
                "message": f"the output could not be read: {exc}",
            }
        else:
            flags = dict(self.flags)
            try:  # the same rule as a trial; localisation's hints at another size are not flags of this one
                passed, message, _ = self.compare(cand, v.ref_out, v.oracle_out, localize=True)
            finally:
                self.flags = flags
            self.shape_results[label] = (
                {"passed": True} if passed else {"passed": False, "failure": "wrong_values", "message": message[:4000]}
            )
        self.shapes_after()

    def shape_error(self, label: str, message: str, lost: bool = False) -> None:
        if label not in self.expected:  # its model failed to construct: already recorded
            return
        self.expected.discard(label)
        self.shape_results[label] = {
            "passed": None if lost else False,
            "failure": "not_run" if lost else "error",
            "message": message,
        }
        self.shapes_after()

    def shapes_after(self) -> None:
        if any(v.label in self.expected for v in self.shape_plan.variants):
            return
        self.conclude_shapes()
        self.ask("stop")

    def shapes_ended(self, ended: dict[str, Any]) -> dict[str, Any]:
        """The runner ended (crashed, was killed at its deadline) during a call at another size:
        that size's failure, not the verdict's. `ended` as `finish` then reads it."""
        plan = self.shape_plan
        pending = [v for v in plan.variants if v.label in self.expected] if plan is not None else []
        if not pending or ended.get("protocol"):
            return ended
        timed_out = ended.get("timed_out_stage")
        how = f"timed out (stage limit {ended.get('limit_s', 0):g} s)" if timed_out else (ended.get("how") or "ended")
        self.shape_results[pending[0].label] = {
            "passed": False,
            "failure": "timeout" if timed_out else "crash",
            "message": f"the candidate's process {how} while ModelNew ran at these sizes",
        }
        for v in pending[1:]:
            self.shape_results[v.label] = {
                "passed": None,
                "failure": "not_run",
                "message": f"not run: the process had ended at {pending[0].name}",
            }
        self.expected -= {v.label for v in pending}
        self.conclude_shapes()
        self.done = True
        return dict(ended, how="", timed_out_stage=None)

    def conclude_shapes(self) -> None:
        """metadata["shapes"], the `shape_specific` flag, and under `strict` the verdict."""
        plan = self.shape_plan
        tried = []
        for v in plan.variants:
            r = self.shape_results.get(v.label, {"passed": None, "failure": "not_run", "message": "no answer"})
            tried.append({"sizes": dict(v.sizes), "name": v.name, "why": v.why, "new_model": v.init_changed, **r})
        failed = [t for t in tried if t["passed"] is False]
        own = ", ".join(f"{k}={v}" for k, v in plan.constants.items())
        self.rec.metadata["shapes"] = {
            "mode": self.cfg.shapes,
            "constants": dict(plan.constants),
            "batch": plan.batch,
            "tried": tried,
            "passed": [t["name"] for t in tried if t["passed"]],
            "failed": [t["name"] for t in failed],
            "dropped": list(plan.dropped),
            "note": plan.note or None,
        }
        if not failed:
            return
        words = {
            "wrong_values": "wrong values",
            "error": "an error",
            "crash": "a crash",
            "timeout": "a time-out",
            "unreadable": "an unreadable output",
        }
        detail = "; ".join(
            f"{t['name']} ({words.get(t['failure'], t['failure'])}: {_first_line(t['message'])[:200]})"
            for t in failed[:4]
        )
        self.flag("shape_specific", f"ModelNew is correct at the problem's own sizes ({own}) but not at {detail}")
        if self.cfg.shapes == "strict":
            first = failed[0]
            self.set_verdict(
                Status.INCORRECT,
                f"ModelNew is correct at the problem's own sizes ({own}) but not at "
                f"other sizes (--shapes strict): {', '.join(t['name'] for t in failed)}\n"
                f"  at {first['name']}: {first['message']}",
                Stage.CORRECTNESS,
            )

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self, ended: dict[str, Any]) -> EvalResult:
        """The final record. `ended`: how the runner ended, as the parent saw it."""
        rec = self.rec
        self.close_stage()
        from kernelwright.engine.child.verdict import Facts, decide

        first = self.first_failure
        facts = Facts(
            trials=self.cfg.trials,
            reported=self.reported,
            first_wrong_trial=first if first is not None and any(not tr.passed for tr in rec.trials) else None,
            failed_trials=sum(1 for tr in rec.trials if not tr.passed),
            ablation_lines=tuple(self.ablation_lines),
            checks_passed=self.checks_passed,
            failed_guards=tuple((f, self.flags[f]) for f in self.failing_guards()),
            timing_expected=self.timing_asked and self.cfg.time_candidate,
            timed=rec.candidate_timing is not None,
            runner_timed_out_stage=ended.get("timed_out_stage") or None,
            runner_limit_s=float(ended.get("limit_s") or 0),
            runner_limit_kind="report" if ended.get("limit_kind") == "report" else "stage",
            protocol_violation=_text(ended["protocol"]) if ended.get("protocol") else None,
            runner_finished=self.done,
            runner_ended_how=str(ended.get("how") or ""),
            runner_stage=str(ended.get("stage") or self.current_stage),
        )
        verdict = decide(facts)
        rec.status, rec.error_log, rec.error_stage = verdict.status, verdict.log, verdict.stage
        rec.correct = verdict.status is Status.PASSED
        if rec.status is not Status.PASSED:  # a figure of a candidate that did not pass is no speed-up
            rec.candidate_ms = rec.speedup = rec.speedup_vs_compile = None
        numeric = [tr for tr in rec.trials if tr.max_abs_err is not None]
        rec.max_abs_err = max((tr.max_abs_err for tr in rec.trials if tr.max_abs_err is not None), default=None)
        rec.mean_abs_err = (sum(tr.mean_abs_err or 0.0 for tr in numeric) / len(numeric)) if numeric else None
        self.degenerate_check()
        rec.metadata["guards"] = {
            "enabled": self.cfg.guards.enabled,
            "checked": list(dict.fromkeys(self.checked)),
            "flags": dict(self.flags),
            "failed": [f for f in self.flags if f in self.cfg.guards.fail_on],
            "fail_on": list(self.cfg.guards.fail_on),
            "nan_fill": self.cfg.guards.enabled and self.cfg.guards.nan_fill,
            "facts": self.facts,
        }
        rec.metadata["numerics"] = dict(self.numerics, oracle_error=self.oracle_error or None)
        rec.metadata["judged_by"] = "judge process (no candidate code)"
        rec.metadata["judge_busy_s"] = {k: round(v, 4) for k, v in self.busy_s.items() if v >= 0.001}
        if self.handoff is not None:
            rec.metadata["judge_busy_s"]["device_handoff"] = round(self.handoff_s, 4)
            if self.handoff_self_test:
                rec.metadata["device_handoff_judge_self_test"] = self.handoff_self_test
            if self.device_clock_off:
                rec.metadata["device_clock_off"] = self.device_clock_off
        return rec

    def degenerate_check(self) -> None:
        """A reference whose output does not depend on its inputs makes any constant 'correct'."""
        self.checked.append("degenerate_reference")
        finding = self.degenerate.finding()
        if finding.degenerate:
            self.flag("degenerate_reference", finding.reason)


# The runner's reports the judge reads, by kind: everything else is ignored.
_HANDLERS = {
    "prestarted": Judge.r_prestarted,
    "stage": Judge.r_stage,
    "startup": Judge.r_startup,
    "build": Judge.r_build,
    "compiled": Judge.r_compiled,
    "failure": Judge.r_failure,
    "call_error": Judge.r_call_error,
    "output": Judge.r_output,
    "ablation": Judge.r_ablation,
    "patched": Judge.r_patched,
    "guards": Judge.r_guards,
    "evidence": Judge.r_evidence,
    "done": Judge.r_done,
}


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _short_tb(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    return "\n".join(lines[:5] + ["  ..."] + lines[-30:] if len(lines) > 40 else lines)


def main(argv: list[str] | None = None) -> int:
    """`judge.py DEVICE [--spare] FD`. The job comes as the first line on stdin (never from a file
    the runner could reach), commands after it, one JSON object per line; the record goes to FD."""
    argv = sys.argv[1:] if argv is None else argv
    faulthandler.enable()
    heap.keep_freed_memory()  # as the other side does: a timed window's outputs reuse the heap
    heap.keep_tunables_to_itself()
    spare = "--spare" in argv
    handoff = [int(a.split("=", 1)[1]) for a in argv if a.startswith("--handoff=")]
    device, fd = [a for a in argv if a != "--spare" and not a.startswith("--handoff=")][-2:]
    chan = Channel(int(fd))
    judge = Judge({"config": {"device": device}}, chan, handoff[0] if handoff else None)
    try:
        judge.startup()
    except Exception:
        traceback.print_exc()
        os._exit(3)
    if spare:
        chan.send("ready")
    if judge.device.type == "cuda":  # (on the CPU the check runs beside no GPU work: left where it is)
        judge.warm_in_background()
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    try:
        judge.take(json.loads(line))
        loaded = judge.load_problem()
        chan.send("loaded", ok=loaded)
        if not loaded:
            judge.ask("stop")
        ended: dict[str, Any] = {}
        handled = 0
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("cmd") == "runner":
                if loaded:
                    judge.on_runner(cmd.get("msg") or {})
                handled += 1
                chan.send("handled", n=handled)  # the parent's clocks of the runner go on (engine/coordinator.py)
            elif cmd.get("cmd") == "ended":
                ended = cmd
                break
        rec = judge.finish(judge.shapes_ended(ended))
    except Exception as exc:  # the judge's own failure: never the candidate's, never a pass
        rec = judge.rec
        rec.status, rec.correct = Status.ENGINE_ERROR, False
        rec.error_log = failure_message(exc)
        rec.metadata["engine_traceback"] = _short_tb(exc)
        rec.candidate_ms = rec.speedup = rec.speedup_vs_compile = None
    chan.send("final", record=rec.to_dict())
    sys.stdout.flush()
    os._exit(0)


def failure_message(exc: BaseException) -> str:
    """The record's error for the judge's own failure: never the candidate's fault; where the device
    or the host refused the judge's own memory (other processes on the device held it), what to do."""
    from kernelwright.engine.child.timing_review import _out_of_memory

    what = f"{type(exc).__name__}: {str(exc)[:300]}"
    if _out_of_memory(exc):
        return (
            "The judge ran out of memory for its own buffers, not the candidate's fault (other processes "
            "on the device held it, or the problem's inputs are too large for a timing window): run fewer "
            "evaluations on this device at once, or set a smaller `window_budget_mb` under [eval.timing] "
            "in kernelwright.toml; " + what
        )
    return f"The engine's judge failed (an engine bug, not the candidate's fault): {what}"


if __name__ == "__main__":
    main()
