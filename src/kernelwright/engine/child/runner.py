"""The runner: the one process that imports and runs the candidate. It produces data, never a verdict.

`python -m kernelwright.engine.child.runner JOB.json` (or `--spare JOB.json`). It builds and
imports the candidate, constructs both models, runs the candidate on each trial's inputs and on
the guards' inputs, writes every output to a file of its own directory (`wire.write_tree`), and
times candidate and reference side by side. What it reports on its pipe is input to the judge
(`judge.py`) and the parent, never trusted: the candidate runs in this process and can write
anything here. Stages are announced so that the parent applies its own schedule of deadlines.

Job modes: `evaluate` (the default), `build_only` (a prebuild: import the candidate so that its
extensions are built into the cache) and `profile_only` (under Nsight Compute: the candidate's
forward only). Imports only torch, the standard library and `kernelwright.core`.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import faulthandler  # noqa: E402
import errno
import json
import os
import select
import sys
import traceback
from dataclasses import asdict
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.engine.child.channel import Channel

TRACEBACK_LINES = 40


def short_tb(exc: BaseException) -> str:
    """The exception and the frames worth reading, trimmed."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    out = text.splitlines()
    if len(out) > TRACEBACK_LINES:
        out = out[:5] + ["  ..."] + out[-(TRACEBACK_LINES - 6):]
    return "\n".join(out)


def _is_triton_compile_error(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    return mod.startswith("triton.compiler") or type(exc).__name__ in ("CompilationError", "CompileTimeAssertionFailure")


def _tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


class Stop(Exception):
    """The parent said stop (or closed our stdin): leave quietly."""


class Runner:
    def __init__(self, job: dict[str, Any], chan: Channel):
        self.job = job
        self.chan = chan
        self.cfg = EvalConfig.from_dict(job["config"])
        self.meta: dict[str, Any] = {}
        self.out_dir = job.get("out_dir") or os.getcwd()
        self._n_files = 0
        self._handoff_off = ""  # why device outputs go into the files instead ('' while they need not)
        self._handoff_sock = None  # the runner's end of the device hand-off socket, opened at first use
        self.started = False
        self.phases: dict[str, float] = {}  # seconds per phase of the runner's own work (sent with the timing)

    def phase(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - t0, 4)
        return now

    # ---- talking to the parent ----------------------------------------------------------------
    def stage(self, name: str) -> None:
        self.chan.stage(name)

    def fail(self, status: str, log: str, stage: str) -> None:
        self.chan.send("failure", status=status, log=log, stage=stage)

    def runtime_error(self, exc: BaseException, what: str, stage: str) -> None:
        from kernelwright.engine.child.build import CandidateBuildError

        if isinstance(exc, CandidateBuildError):
            self.compile_error(exc)
        elif _is_triton_compile_error(exc):
            self.fail("compile_error", f"{what}: Triton compilation failed:\n" + short_tb(exc), stage)
        else:
            self.fail("runtime_error", f"{what}:\n" + short_tb(exc), stage)

    def blame(self, exc: BaseException, what: str = "", stage: str = "correctness") -> None:
        """Whose fault an exception that escaped engine code is (engine/child/faults.py)."""
        from kernelwright.engine.child import faults

        model = getattr(self, "cand_model", None)
        objs = tuple(model.modules()) if model is not None else ()
        device = getattr(self, "device", None)
        b = faults.classify(exc, device.type if device is not None else "cpu", self.job.get("problem_path"),
                            short_tb(exc), candidate_objects=objs)
        status = b.status.value
        log = (f"{what}:\n" if what and status == "runtime_error" else "") + b.log
        self.chan.send("failure", status=status, log=log, stage=stage,
                       engine_traceback=b.metadata.get("engine_traceback"))

    def write(self, label: str, obj: Any) -> str:
        from kernelwright.engine.child.wire import write_tree

        self._n_files += 1
        name = f"out_{self._n_files:03d}_{label}.kwt"
        dirs = [self.out_dir] + ([self.job["spill_dir"]] if self.job.get("spill_dir") else [])
        try:
            for i, d in enumerate(dirs):  # memory-backed first; the disk when it is full
                path = os.path.join(d, name)
                try:
                    os.unlink(path)  # whatever stands there was not written by the engine
                except FileNotFoundError:
                    pass
                try:
                    write_tree(path, obj, ship=self.shipper(name))
                    break
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or i == len(dirs) - 1:
                        raise
                    os.unlink(path)
        except OSError as exc:  # only this process writes here: the candidate got in the way
            self.fail("runtime_error", f"The candidate's process could not write its output ({exc.strerror}): "
                      "something in it replaced or blocked the engine's output files", "correctness")
            raise Stop() from exc
        return name

    def shipper(self, name: str):
        """How the bytes of this output's CUDA tensors reach the judge: on the device, beside the
        file (`device_handoff`), when the parent gave a socket for it and this machine can export;
        None (in the file) otherwise or after the first failure."""
        fd = self.job.get("handoff_fd")
        if not isinstance(fd, int) or getattr(self, "device", None) is None or self.device.type != "cuda" \
                or self._handoff_off:
            return None
        import socket

        from kernelwright.engine.child import device_handoff

        if self._handoff_sock is None:
            try:
                self._handoff_sock = socket.socket(fileno=fd)
            except OSError as exc:
                self._handoff_off = f"socket: {exc}"
                return None

        def ship(i: int, t) -> bool:
            if self._handoff_off or t.device.type != "cuda":
                return False
            try:
                device_handoff.send(self._handoff_sock, f"{name}#{i}#{t.numel() * t.element_size()}", t)
                return True
            except Exception as exc:  # written into the file instead; the record says why
                self._handoff_off = f"{type(exc).__name__}: {str(exc)[:200]}"
                self.meta["device_handoff_off"] = self._handoff_off
                return False

        return ship

    def poll_command(self, block: bool) -> str | None:
        """A line from the parent on stdin: `time`, `ablate T`, `stop`; None when none is waiting."""
        buf = getattr(self, "_stdin_buf", b"")
        while b"\n" not in buf:
            ready, _, _ = select.select([0], [], [], None if block else 0)
            if not ready:
                self._stdin_buf = buf
                return None
            chunk = os.read(0, 4096)
            if not chunk:
                raise Stop()
            buf += chunk
        line, self._stdin_buf = buf.split(b"\n", 1)
        text = line.decode(errors="replace").strip()
        if text == "stop":
            raise Stop()
        return text

    # ---- stages ---------------------------------------------------------------------------------
    def startup(self) -> None:
        import torch

        from kernelwright.engine.child.problem_io import device_name, resolve_device

        self.stage("startup")
        if self.job.get("mode") == "build_only":
            self.device = torch.device("cpu")  # compilation needs no GPU
        else:
            self.device = resolve_device(self.cfg.device)
        if self.device.type == "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            from kernelwright.core.arch import arch_list_for

            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list_for(*torch.cuda.get_device_capability(self.device))
        self.chan.send("startup", device=device_name(self.device), device_type=self.device.type,
                       startup_s=time.perf_counter() - _T0, torch_version=torch.__version__,
                       cuda_version=torch.version.cuda, python=sys.version.split()[0])
        self.started = True

    def warm_up(self) -> None:
        """A spare's extra start-up: the device context, the build machinery, the engine's modules."""
        import torch
        import torch.utils.cpp_extension  # noqa: F401

        from kernelwright.engine.child import build, compare, evidence, faults, guards, stability, timing, wire  # noqa: F401

        if self.device.type == "cuda":
            torch.empty(1, device=self.device)
            torch.cuda.synchronize(self.device)
            if isinstance(self.job.get("handoff_fd"), int):  # the driver's calls for device outputs, loaded now
                from kernelwright.engine.child import device_handoff

                why = device_handoff.probe(self.device)
                if why:
                    self._handoff_off = why
                    self.meta["device_handoff_off"] = why
        try:  # the guards' call tracer opens a profiler session: its first one costs seconds (kineto)
            from torch.autograd.profiler import profile

            with profile(use_device="cuda") if self.device.type == "cuda" else profile():
                torch.ones(1, device=self.device).add_(1)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
        except Exception:
            pass

    def run(self) -> None:
        try:
            if not self.started:
                self.startup()
            if not self.build():
                return
            mode = self.job.get("mode", "evaluate")
            if mode == "build_only":
                self.chan.send("built")
                return
            if mode == "profile_only":
                self.profile_forwards()
                return
            if not self.init():
                return
            if not self.correctness():
                return
            self.await_timing()
        except Stop:
            return
        except Exception as exc:  # the candidate's error, a CUDA error it left, or the engine's own
            self.blame(exc)
        finally:
            self.chan.send("done")

    def build(self) -> bool:
        from kernelwright.engine.child import build, guards
        from kernelwright.engine.child.problem_io import ProblemIO, load_module

        self.stage("build")
        build.install_build_cache(os.path.join(self.cfg.cache_dir, "builds"), self.job["candidate_path"],
                                  use_pch=self.cfg.build.use_pch, lean_headers=self.cfg.build.lean_headers,
                                  # load only verified artefacts of the shared cache, build the rest privately
                                  verified=self.job.get("verified_builds"), private_root=self.job.get("private_builds"),
                                  failed=self.job.get("failed_builds"))
        try:
            self.problem = load_module(self.job["problem_path"], "kw_problem")
        except Exception as exc:
            self.fail("runtime_error", "The reference problem failed to import:\n" + short_tb(exc), "reference")
            return False
        self.io = ProblemIO(self.problem, self.device, self.cfg.inputs_on_device, self.meta)
        self.snapshot = guards.FunctionSnapshot() if self.cfg.guards.enabled else None
        self.threads_at_start = guards.python_threads()
        ok = True
        try:
            self.candidate = load_module(self.job["candidate_path"], "kw_candidate")
        except build.CandidateBuildError as exc:
            self.compile_error(exc)
            ok = False
        except SyntaxError as exc:
            self.fail("format_error", f"SyntaxError: {exc.msg} (line {exc.lineno})", "build")
            ok = False
        except Exception as exc:
            if _is_triton_compile_error(exc):
                self.fail("compile_error", short_tb(exc), "build")
            else:
                self.fail("runtime_error", "The candidate raised while being imported:\n" + short_tb(exc), "build")
            ok = False
        builds = [{k: v for k, v in b.items() if k not in ("output", "issues")} for b in build.BUILD_LOG]
        self.chan.send("build", builds=builds)
        if not ok:
            return False
        failed = [b for b in build.BUILD_LOG if b.get("ok") is False and "output" in b]
        if failed:  # the candidate swallowed its own build error
            b = failed[0]
            self.compile_error(build.CandidateBuildError(b["name"], b["output"], []), issues=b["issues"],
                               caught=True)
            return False
        if not hasattr(self.candidate, "ModelNew"):
            self.fail("format_error", "The candidate defines no class ModelNew; define class ModelNew(nn.Module)", "build")
            return False
        self.chan.send("compiled")
        return True

    def compile_error(self, exc, issues=None, caught: bool = False) -> None:
        issues = issues if issues is not None else [asdict(i) for i in exc.issues]
        head = []
        for i in issues[:5]:
            where = f"{i['file']}:{i['line']}" if i.get("file") else "build"
            cand = f" (candidate line {i['candidate_line']})" if i.get("candidate_line") else ""
            src = f"\n      {i['source_line'].strip()}" if i.get("source_line") else ""
            head.append(f"  {where}{cand}: {i['message']}{src}")
        summary = f"Compilation of extension '{exc.name}' failed"
        if head:
            summary += " with:\n" + "\n".join(head)
        if caught:
            summary = ("The candidate caught this build failure and would have run PyTorch instead (its fallback "
                       "is not evaluated: the extension it meant to use did not build).\n" + summary)
        self.chan.send("failure", status="compile_error", stage="build", compile_issues=issues[:50], caught=caught,
                       log=summary + "\n\nCompiler output (end):\n" + _tail(exc.output, 60))

    def init(self) -> bool:
        self.stage("init")
        seed = self.cfg.seed
        try:
            self.ref_model = self.io.construct(self.problem.Model, seed)
        except Exception as exc:
            self.fail("runtime_error", "The reference Model failed to construct:\n" + short_tb(exc), "reference")
            return False
        try:
            self.cand_model = self.io.construct(self.candidate.ModelNew, seed)
            self.sync()
        except Exception as exc:
            self.runtime_error(exc, "ModelNew failed to construct", "init")
            return False
        return True

    def sync(self) -> None:
        from kernelwright.engine.child import faults

        faults.sync_and_check(self.device)  # a pending CUDA error surfaces here, as the candidate's

    def patches(self, when: str) -> None:
        """Report (and undo) any patch of timing, verifier or torch functions."""
        if self.snapshot is None:
            return
        changed = self.snapshot.changed()
        if changed:
            self.snapshot.restore()
            self.chan.send("patched", names=changed[:50], when=when)

    def call(self, inputs: Any, nan_fill: bool = True) -> Any:
        import torch

        from kernelwright.engine.child import guards
        from kernelwright.engine.child.trees import clone

        with torch.no_grad(), guards.nan_fill(nan_fill and self.cfg.guards.enabled and self.cfg.guards.nan_fill):
            out = self.cand_model(*clone(inputs))
        self.sync()
        return out

    def correctness(self) -> bool:
        from kernelwright.engine.child.problem_io import fingerprint, trial_seed

        self.patches("at import or construction")
        self.stage("correctness")
        for t in range(self.cfg.trials):
            cmd = self.poll_command(block=False)
            if cmd and cmd.startswith("ablate"):
                self.ablate(cmd)
            seed = trial_seed(self.cfg.seed, t)
            t0 = time.perf_counter()
            inputs = self.io.inputs(seed)
            fp = fingerprint(inputs)
            t0 = self.phase("trial_inputs", t0)
            try:
                out = self.call(inputs)
            except Exception as exc:
                self.runtime_error(exc, f"ModelNew.forward raised on trial {t} (seed {seed})", "correctness")
                self.chan.send("trial_error", trial=t, seed=seed, message=str(exc)[:500])
                return False
            t0 = self.phase("trial_calls", t0)
            self.chan.send("trial", trial=t, seed=seed, file=self.write(f"trial{t}", out), fingerprint=fp)
            self.phase("trial_writes", t0)
            del out
        self.patches("while ModelNew ran")
        if self.cfg.guards.enabled:
            t0 = time.perf_counter()
            self.guarded_calls()
            self.phase("guarded_calls", t0)
        return True

    def guarded_calls(self) -> None:
        """The calls the judge's guards read: outputs of one traced call, the inputs after it, the
        output after the same tensors were refilled with new values, and the first output again."""
        import torch

        from kernelwright.engine.child import build, guards
        from kernelwright.engine.child.problem_io import guard_seeds
        from kernelwright.engine.child.trees import clone

        seeds = guard_seeds(self.cfg.seed)
        inputs = self.io.inputs(seeds["call"])
        ref_inputs = clone(inputs)
        with torch.no_grad():
            ref_out = self.ref_model(*ref_inputs)
        self.sync()
        candidate_text = ""
        try:
            with open(self.job["candidate_path"]) as f:
                candidate_text = f.read()
        except OSError:
            pass
        ext_names = {b.get("name") for b in build.BUILD_LOG if b.get("name")}
        ext_dirs = [b.get("dir") for b in build.BUILD_LOG if b.get("dir")]
        tracer = guards.CallTracer(self.job["problem_path"], self.job["candidate_path"], ext_names, ext_dirs,
                                   candidate_text, self.cfg.guards.profile_kernels, self.device)
        nan = self.cfg.guards.nan_fill
        with torch.no_grad(), guards.nan_fill(nan):
            out_a = tracer.run(lambda: self.cand_model(*inputs))  # the same tensors: mutation shows
        self.sync()
        self.patches("while ModelNew ran")
        facts = {k: v for k, v in vars(tracer.facts).items() if v}
        facts["custom_kernel"] = tracer.facts.custom_kernel
        files = {"out_a": self.write("guard_a", out_a), "inputs_after": self.write("guard_inputs", inputs)}
        in_keys = {guards.storage_key(x): n for n, x in guards.tensors(inputs)}
        ref_in_keys = {guards.storage_key(x) for _, x in guards.tensors(ref_inputs)}
        ref_alias = {n for n, o in guards.tensors(ref_out) if guards.storage_key(o) in ref_in_keys}
        facts["aliases"] = [[n, in_keys[guards.storage_key(o)]] for n, o in guards.tensors(out_a)
                            if guards.storage_key(o) in in_keys and n not in ref_alias]
        if self.cfg.guards.refill_inputs:
            guards.refill_in_place(inputs, self.io.inputs(seeds["refill"]))
            with torch.no_grad(), guards.nan_fill(nan):
                out_b = self.cand_model(*inputs)
            self.sync()
            files["out_refill"] = self.write("guard_refill", out_b)
            files["out_a_again"] = self.write("guard_a_again", out_a)
            del out_b
        new_threads = [t for t in guards.python_threads() - self.threads_at_start if t.is_alive()]
        facts["threads"] = [t.name for t in new_threads[:5]]
        self.chan.send("guards", files=files, facts=facts)

    def ablate(self, cmd: str) -> None:
        """Which parameter, zeroed in both models, makes the mismatch on trial T go away (evidence
        for the Judge, computed here because it needs both models; never a verdict)."""
        import torch

        from kernelwright.engine.child.compare import compare_outputs, flatten
        from kernelwright.engine.child.problem_io import trial_seed
        from kernelwright.engine.child.trees import clone

        try:
            t = int(cmd.split()[1])
        except (IndexError, ValueError):
            return
        inputs = self.io.inputs(trial_seed(self.cfg.seed, t))
        cand_params = dict(self.cand_model.named_parameters())
        shared = [(n, p, cand_params[n]) for n, p in self.ref_model.named_parameters()
                  if n in cand_params and cand_params[n].shape == p.shape and p.is_floating_point()]
        lines: list[str] = []
        t0 = time.perf_counter()
        for name, p_ref, p_cand in shared[:8]:
            if time.perf_counter() - t0 > 3.0:
                break
            saved_ref, saved_cand = p_ref.detach().clone(), p_cand.detach().clone()
            try:
                with torch.no_grad():
                    p_ref.zero_()
                    p_cand.zero_()
                    ref_out = self.ref_model(*clone(inputs))
                    cand_out = self.cand_model(*clone(inputs))
                self.sync()
                rep = compare_outputs(cand_out, ref_out, self.cfg.atol, self.cfg.rtol)
                nonzero = any(isinstance(x, torch.Tensor) and x.numel() and bool(x.ne(0).any())
                              for _, x in flatten(ref_out))
                if rep.passed and nonzero:
                    lines.append(f"the mismatch disappears when parameter '{name}' is set to 0 in both models "
                                 f"(outputs still non-zero): look at how '{name}' is used")
            except Exception:
                pass
            finally:
                with torch.no_grad():
                    p_ref.copy_(saved_ref)
                    p_cand.copy_(saved_cand)
        self.chan.send("ablation", trial=t, lines=lines)

    def await_timing(self) -> None:
        """Wait for the parent: `time` (the judge accepted the outputs), `ablate T`, or `stop`."""
        self.chan.send("await")
        t0 = time.perf_counter()
        while True:
            cmd = self.poll_command(block=True)
            if cmd and cmd.startswith("ablate"):
                self.ablate(cmd)
                self.chan.send("await")
            elif cmd == "time":
                break
        self.phase("await_judge", t0)
        if self.cfg.time_candidate:
            self.timing()
        if self.cfg.profile.enabled or self.cfg.profile.roofline:
            self.evidence()

    def timing(self) -> None:
        import torch

        from kernelwright.engine.child import guards
        from kernelwright.engine.child.problem_io import guard_seeds, trial_seed
        from kernelwright.engine.child.timing import time_with_stability

        self.stage("timing")
        t_setup = time.perf_counter()
        self.patches("before timing")
        seeds = guard_seeds(self.cfg.seed)
        inputs = self.io.inputs(trial_seed(self.cfg.seed, 0))
        sets = {"A": [x.detach().clone() for _, x in guards.tensors(inputs)],
                "B": [x.detach().clone() for _, x in guards.tensors(self.io.inputs(seeds["timing_b"]))]}
        state = {"set": "A", "round": 0}
        live = [x for _, x in guards.tensors(inputs)]

        def between_rounds() -> None:
            # new contents in the same tensors, through `.data`: neither `_version` nor `data_ptr`
            # tells the candidate that its inputs changed (a replay keyed on them is caught)
            state["round"] += 1
            state["set"] = "B" if state["set"] == "A" else "A"
            with torch.no_grad():
                for x, src in zip(live, sets[state["set"]]):
                    if x.shape == src.shape:
                        x.data.copy_(src)

        import random

        rng = random.Random(os.urandom(8))
        keep = 8
        samples: list[tuple[str, Any]] = []
        seen = [0]

        def check(name: str, out: Any) -> None:
            # a uniform random sample of the timed calls (reservoir sampling): which calls are
            # checked is decided by a random draw after each call, so no call is safe to fake
            if name != "candidate":
                return
            seen[0] += 1
            if len(samples) < keep:
                samples.append((state["set"], _detached_clone(out)))
            else:
                j = rng.randrange(seen[0])
                if j < keep:
                    samples[j] = (state["set"], _detached_clone(out))

        fns = {"candidate": lambda: self.cand_model(*inputs), "reference": lambda: self.ref_model(*inputs)}
        if self.cfg.timing.compare_compile:
            try:
                compiled = torch.compile(self.ref_model)
                with torch.no_grad():
                    compiled(*inputs)
                fns["compile_reference"] = lambda: compiled(*inputs)
            except Exception as exc:
                self.meta["compile_reference_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        use_check = self.cfg.guards.enabled and self.cfg.guards.check_timed_outputs
        t_stage = time.perf_counter()
        self.phase("timing_setup", t_setup)
        try:
            with torch.no_grad():
                stats, report = time_with_stability(fns, self.device, self.cfg.timing,
                                                    check=check if use_check else None, between_rounds=between_rounds)
        except Exception as exc:
            from kernelwright.engine.child.build import CandidateBuildError

            if isinstance(exc, CandidateBuildError) or _is_triton_compile_error(exc):
                self.runtime_error(exc, "ModelNew failed while being timed", "timing")
            else:
                self.blame(exc, "ModelNew failed while being timed", "timing")
            return
        self.meta["timing"] = report.to_dict()
        stage_s = time.perf_counter() - t_stage
        t0 = self.phase("timed_calls", t_stage)
        self.candidate_ms = stats["candidate"].median_ms
        # the live tensors back to set A: the escape measurement runs on known contents
        with torch.no_grad():
            for x, src in zip(live, sets["A"]):
                if x.shape == src.shape:
                    x.data.copy_(src)
        timer = None
        if self.device.type == "cuda" and self.cfg.guards.enabled:
            # rounds of interleaved candidate/reference calls, each timed on the host and by events at
            # once; the judge decides on them (confirmed in every round before it fails)
            rounds = []
            with torch.no_grad():
                for _ in range(self.cfg.guards.escape_rounds):
                    rounds.append(guards.measure_escape_round(fns["candidate"], fns["reference"], self.device))
                    if not guards.round_escapes(rounds[-1].summary(), self.cfg.guards.escape_ratio, 0.05):
                        break
            timer = {"rounds": [asdict(r) for r in rounds]}
        t0 = self.phase("escape_rounds", t0)
        files = [[s, self.write(f"timed{i}", out)] for i, (s, out) in enumerate(samples)]
        self.phase("sample_writes", t0)
        self.meta["phases_s"] = dict(self.phases)
        self.chan.send("timing", stats={k: asdict(v) for k, v in stats.items()}, samples=files, timer=timer,
                       stage_s=stage_s, meta=self.meta)
        self.patches("during timing")
        if self.cfg.guards.enabled and self.cfg.guards.refill_inputs:
            guards.refill_in_place(inputs, self.io.inputs(seeds["after_timing"]))
            try:
                with torch.no_grad(), guards.nan_fill(self.cfg.guards.nan_fill):
                    out = self.cand_model(*inputs)
                self.sync()
            except Exception as exc:
                self.runtime_error(exc, "ModelNew failed after timing", "timing")
                return
            self.chan.send("after_timing", file=self.write("after_timing", out))

    def evidence(self) -> None:
        from kernelwright.engine.child import build, evidence
        from kernelwright.engine.child.problem_io import trial_seed

        self.stage("profile")
        inputs = self.io.inputs(trial_seed(self.cfg.seed, 0))
        meta = evidence.collect(self.cfg, self.device, self.ref_model, self.cand_model, inputs,
                                getattr(self, "candidate_ms", None), self.job["candidate_path"], build.BUILD_LOG,
                                build.BUILT_MODULES, self.candidate, self.job["problem_path"])
        self.chan.send("evidence", metadata=meta)

    def profile_forwards(self) -> None:
        """`profile_only` (under ncu): construct ModelNew, run the forward; nothing else launches kernels."""
        import torch

        self.stage("profile")
        try:
            model = self.io.construct(self.candidate.ModelNew, self.cfg.seed)
            inputs = self.io.inputs(self.cfg.seed)
            with torch.no_grad():
                for _ in range(self.cfg.profile.forward_runs):
                    model(*inputs)
            self.sync()
        except Exception as exc:
            self.runtime_error(exc, "ModelNew failed while being profiled", "profile")
            return
        self.chan.send("profiled")


def _detached_clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_detached_clone(o) for o in obj)
    if isinstance(obj, dict) and type(obj) is dict:
        return {k: _detached_clone(v) for k, v in obj.items()}
    return obj


def main(argv: list[str] | None = None) -> int:
    """`runner.py JOB.json`, or `runner.py --spare JOB.json`: a spare starts up, says `ready`, waits
    for a line on stdin, then re-reads JOB.json (now the real job) and runs it."""
    argv = sys.argv[1:] if argv is None else argv
    faulthandler.enable()
    spare = argv[0] == "--spare"
    job_path = argv[-1]
    with open(job_path) as f:
        job = json.load(f)
    chan = Channel(job.get("fd"), job.get("record_path"))
    runner = Runner(job, chan)
    if spare:
        try:
            runner.startup()
            runner.warm_up()
        except Exception:
            traceback.print_exc()
            os._exit(3)
        t_ready = time.perf_counter()
        chan.send("ready")
        try:
            if not runner.poll_command(block=True):
                os._exit(0)
        except Stop:
            os._exit(0)
        with open(job_path) as f:
            job = json.load(f)
        runner.job = job
        runner.cfg = EvalConfig.from_dict(job["config"])
        runner.out_dir = job.get("out_dir") or os.getcwd()
        chan.send("prestarted", idle_s=round(time.perf_counter() - t_ready, 3), startup_s=t_ready - _T0)
    runner.run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a candidate's extension may crash in it


if __name__ == "__main__":
    main()
