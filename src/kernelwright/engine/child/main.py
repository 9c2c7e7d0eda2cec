"""Entry point of the evaluation child: `python -m kernelwright.engine.child.main JOB.json`.

Runs in a fresh process with a scrubbed environment, its own working directory, and a pipe to
the parent (fd given in the job). It announces each stage before starting it, so the parent
applies that stage's deadline, and sends the record as it stands after each stage, so a crash
later loses nothing already measured. Imports only torch and the standard library.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # process start, near enough: startup_s counts the torch import from here

import faulthandler  # noqa: E402  (imports after _T0 on purpose)
import importlib.util
import json
import os
import platform
import sys
import traceback
from dataclasses import asdict
from typing import Any

from kernelwright.core.config import EvalConfig
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.trees import clone as _clone
from kernelwright.engine.child.trees import to_device as _to_device
from kernelwright.core.record import Stage, Status

TRACEBACK_LINES = 40


class ReferenceFailure(Exception):
    """The reference problem itself failed: the problem's fault, not the candidate's."""


def _load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _short_tb(exc: BaseException, candidate_path: str | None = None) -> str:
    """The exception and the frames worth reading (the candidate's own first), trimmed."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines)
    out = text.splitlines()
    if len(out) > TRACEBACK_LINES:
        out = out[:5] + ["  ..."] + out[-(TRACEBACK_LINES - 6):]
    return "\n".join(out)


def _is_triton_compile_error(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    return mod.startswith("triton.compiler") or type(exc).__name__ in ("CompilationError", "CompileTimeAssertionFailure")


def trial_seed(base: int, trial: int) -> int:
    return base + 1000 * (trial + 1)


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


class Evaluation:
    """One evaluation inside the child. Each stage method fills `self.rec` or raises `Verdict`."""

    def __init__(self, job: dict[str, Any], chan: Channel):
        self.job = job
        self.chan = chan
        self.cfg = EvalConfig.from_dict(job["config"])
        self.rec: dict[str, Any] = {
            "status": Status.RUNTIME_ERROR.value,
            "atol": self.cfg.atol,
            "rtol": self.cfg.rtol,
            "seed": self.cfg.seed,
            "stage_times": {},
            "metadata": {},
            "trials": [],
            "compile_issues": [],
        }
        self.t0 = time.perf_counter()

    # ---- helpers ------------------------------------------------------------------------
    def stage(self, stage: Stage) -> None:
        self.chan.stage(stage.value)
        self._stage_start = time.perf_counter()
        self._stage = stage

    def stage_done(self, key: str) -> None:
        self.rec["stage_times"][key] = time.perf_counter() - self._stage_start
        self.chan.record(self.rec)

    def verdict(self, status: Status, log: str, stage: Stage | None = None) -> None:
        self.rec["status"] = status.value
        self.rec["error_log"] = log
        self.rec["error_stage"] = (stage or self._stage).value

    # ---- stages ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            if not self.started:
                self.startup()
            self._run()
        except Exception as exc:  # a bug in a stage's bookkeeping: record it, never lose the record
            self._blame(exc)  # [verdicts] the candidate's error, a CUDA error it left, or engine_error
        self.rec["stage_times"]["total_s"] = time.perf_counter() - self.t0
        return self.rec

    started = False

    def startup(self) -> None:
        """Python, torch, the device: everything before the candidate's code is touched."""
        self.stage(Stage.STARTUP)
        self._stage_start = _T0
        import torch

        self.device = self._resolve_device(torch)
        self.rec["device"] = device_name(self.device)
        self.rec["device_type"] = self.device.type
        self.rec["metadata"].update(
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            python=sys.version.split()[0],
        )
        if self.device.type == "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            from kernelwright.core.arch import arch_list_for

            # build for this GPU only: a fraction of the default multi-arch build time
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list_for(*torch.cuda.get_device_capability(self.device))
        self.started = True
        self.stage_done("startup_s")

    def warm_up(self) -> None:
        """A spare's extra start-up: what the first evaluation would otherwise pay on its critical
        path (the device context, the build machinery, the engine's own modules). No candidate
        or problem code runs here."""
        import torch
        import torch.utils.cpp_extension  # noqa: F401  (setuptools and friends: ~0.5 s)

        from kernelwright.engine.child import build, checks, compare, evidence, guards, numerics, timing  # noqa: F401

        if self.device.type == "cuda":
            torch.empty(1, device=self.device)  # the CUDA context
            torch.cuda.synchronize(self.device)

    def take(self, job: dict[str, Any]) -> None:
        """A spare's job has come: the real configuration replaces the one it started with."""
        self.job = job
        self.cfg = EvalConfig.from_dict(job["config"])
        self.rec.update(atol=self.cfg.atol, rtol=self.cfg.rtol, seed=self.cfg.seed)

    def _run(self) -> None:
        if not self._build():
            return
        mode = self.job.get("mode", "evaluate")
        if mode == "build_only":  # a prebuild: the extensions are in the cache now
            self.rec["status"] = Status.PASSED.value
            return
        if mode == "profile_only":  # under ncu: the candidate's forward, nothing else
            from kernelwright.engine.child.evidence import run_forwards

            self.stage(Stage.PROFILE)
            run_forwards(self, self.cfg.profile.forward_runs)
            self.stage_done("profile_s")
            return
        if not self._init():
            return
        if not self._correctness():
            return
        self.rec["status"] = Status.PASSED.value
        self.rec["correct"] = True
        self.chan.record(self.rec)
        if self.cfg.time_candidate:
            self._timing()
        if self.rec["status"] == Status.PASSED.value and (self.cfg.profile.enabled or self.cfg.profile.roofline):
            self._profile()

    def _profile(self) -> None:
        """Kernel profile (torch.profiler), reference FLOPs and bytes, device facts, roofline."""
        from kernelwright.engine.child import build, evidence

        self.stage(Stage.PROFILE)
        inputs = self._inputs(trial_seed(self.cfg.seed, 0))
        self.rec["metadata"].update(evidence.collect(
            self.cfg, self.device, self.ref_model, self.cand_model, inputs, self.rec.get("candidate_ms"),
            self.job["candidate_path"], build.BUILD_LOG, build.BUILT_MODULES, self.candidate,
            self.job["problem_path"],
        ))
        self.stage_done("profile_s")

    def _resolve_device(self, torch):
        if self.job.get("mode") == "build_only":
            return torch.device("cpu")  # compilation needs no GPU (CUDA_VISIBLE_DEVICES is empty)
        want = self.cfg.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA requested but not available in the evaluation child")
        return torch.device(want)

    def _build(self) -> bool:
        from kernelwright.engine.child import build

        self.stage(Stage.BUILD)
        build.install_build_cache(os.path.join(self.cfg.cache_dir, "builds"), self.job["candidate_path"],
                                  use_pch=self.cfg.build.use_pch, lean_headers=self.cfg.build.lean_headers)
        try:
            self.problem = _load_module(self.job["problem_path"], "kw_problem")
        except Exception as exc:
            self.verdict(Status.RUNTIME_ERROR, "The reference problem failed to import:\n" + _short_tb(exc),
                         Stage.REFERENCE)
            return False
        self._checks().take_snapshot()  # guards: functions as they were before the candidate ran
        try:
            self.candidate = _load_module(self.job["candidate_path"], "kw_candidate")
        except build.CandidateBuildError as exc:
            self._compile_error(exc)
            return False
        except SyntaxError as exc:
            self.verdict(Status.FORMAT_ERROR, f"SyntaxError: {exc.msg} (line {exc.lineno})")
            return False
        except Exception as exc:
            if _is_triton_compile_error(exc):
                self.verdict(Status.COMPILE_ERROR, _short_tb(exc))
            else:
                self.verdict(Status.RUNTIME_ERROR, "The candidate raised while being imported:\n" + _short_tb(exc))
            return False
        finally:
            self.rec["metadata"]["builds"] = [
                {k: v for k, v in b.items() if k not in ("output", "issues")} for b in build.BUILD_LOG
            ]
        failed = [b for b in build.BUILD_LOG if b.get("ok") is False and "output" in b]
        if failed:  # the candidate swallowed its own build error
            b = failed[0]
            self._compile_error(build.CandidateBuildError(b["name"], b["output"], []), issues=b["issues"])
            self.rec["error_log"] = (  # [verdicts] say what the candidate did with the failure
                "The candidate caught this build failure and would have run PyTorch instead (its fallback "
                "is not evaluated: the extension it meant to use did not build).\n" + self.rec["error_log"])
            self.rec["metadata"]["build_failure_caught"] = True
            return False
        if not hasattr(self.candidate, "ModelNew"):
            self.verdict(Status.FORMAT_ERROR, "The candidate defines no class ModelNew; define class ModelNew(nn.Module)")
            return False
        self.rec["compiled"] = True
        self.stage_done("build_s")
        return True

    def _compile_error(self, exc, issues=None) -> None:
        issues = issues if issues is not None else [asdict(i) for i in exc.issues]
        self.rec["compile_issues"] = issues
        head = []
        for i in issues[:5]:
            where = f"{i['file']}:{i['line']}" if i.get("file") else "build"
            cand = f" (candidate line {i['candidate_line']})" if i.get("candidate_line") else ""
            src = f"\n      {i['source_line'].strip()}" if i.get("source_line") else ""
            head.append(f"  {where}{cand}: {i['message']}{src}")
        summary = f"Compilation of extension '{exc.name}' failed"
        if head:
            summary += " with:\n" + "\n".join(head)
        self.verdict(Status.COMPILE_ERROR, summary + "\n\nCompiler output (end):\n" + _tail(exc.output, 60), Stage.BUILD)

    def _init(self) -> bool:
        import torch

        self.stage(Stage.INIT)
        seed = self.cfg.seed
        try:
            torch.manual_seed(seed)
            init_inputs = self.problem.get_init_inputs()
            torch.manual_seed(seed)
            self.ref_model = self.problem.Model(*init_inputs).to(self.device).eval()
        except Exception as exc:
            self.verdict(Status.RUNTIME_ERROR, "The reference Model failed to construct:\n" + _short_tb(exc),
                         Stage.REFERENCE)
            return False
        try:
            torch.manual_seed(seed)
            self.cand_model = self.candidate.ModelNew(*init_inputs).to(self.device).eval()
            self._sync()
        except Exception as exc:
            self._runtime_error(exc, "ModelNew failed to construct")
            return False
        self.stage_done("init_s")
        return True

    def _sync(self) -> None:
        from kernelwright.engine.child import faults

        faults.sync_and_check(self.device)  # [verdicts] a pending CUDA error surfaces here, as the candidate's

    def _blame(self, exc: BaseException, what: str = "") -> None:
        """[verdicts] Classify an exception that escaped engine code (engine/child/faults.py)."""
        from kernelwright.engine.child import faults

        device = getattr(self, "device", None)
        model = getattr(self, "cand_model", None)
        objs = tuple(model.modules()) if model is not None else ()
        blame = faults.classify(exc, device.type if device is not None else "cpu", self.job.get("problem_path"),
                                _short_tb(exc), candidate_objects=objs)
        self.verdict(blame.status, (f"{what}:\n" if what and blame.status is Status.RUNTIME_ERROR else "") + blame.log)
        self.rec["metadata"].update(blame.metadata)
        if blame.status is Status.ENGINE_ERROR:
            for key in ("speedup", "candidate_ms", "speedup_vs_compile"):
                self.rec[key] = None

    def _runtime_error(self, exc: BaseException, what: str) -> None:
        from kernelwright.engine.child.build import CandidateBuildError

        if isinstance(exc, CandidateBuildError):
            self._compile_error(exc)
        elif _is_triton_compile_error(exc):
            self.verdict(Status.COMPILE_ERROR, f"{what}: Triton compilation failed:\n" + _short_tb(exc))
        else:
            self.verdict(Status.RUNTIME_ERROR, f"{what}:\n" + _short_tb(exc))

    def _inputs(self, seed: int):
        """The problem's inputs for one seed, on the device: drawn there (`inputs_on_device`), or on
        the CPU and copied where get_inputs cannot run with the device as torch's default."""
        import torch

        if self.cfg.inputs_on_device and self.device.type != "cpu" and not getattr(self, "_inputs_on_cpu", False):
            torch.manual_seed(seed)
            try:
                with torch.device(self.device):
                    inputs = self.problem.get_inputs()
                self.rec["metadata"]["inputs_drawn_on"] = self.device.type
                return _to_device(inputs, self.device)
            except Exception as exc:
                self._inputs_on_cpu = True
                self.rec["metadata"]["inputs_drawn_on"] = "cpu"
                self.rec["metadata"]["inputs_on_device_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        torch.manual_seed(seed)
        return _to_device(self.problem.get_inputs(), self.device)

    def _checks(self):
        """Numerics verdict and reward-hacking guards (engine/child/checks.py)."""
        if getattr(self, "_checks_obj", None) is None:
            from kernelwright.engine.child.checks import Checks

            self._checks_obj = Checks(self)
        return self._checks_obj

    def _correctness(self) -> bool:
        self._checks().check_patches("at import or construction")  # before the verifier is imported
        import torch

        from kernelwright.engine.child.compare import compare_outputs
        from kernelwright.engine.child.guards import nan_fill

        self.stage(Stage.CORRECTNESS)
        all_ok = True
        first_fail = None
        max_err, mean_errs = 0.0, []
        for t in range(self.cfg.trials):
            seed = trial_seed(self.cfg.seed, t)
            try:
                inputs = self._inputs(seed)
                with torch.no_grad():
                    ref_out = self.ref_model(*_clone(inputs))
                self._sync()
            except Exception as exc:
                self.verdict(Status.RUNTIME_ERROR, "The reference Model failed to run:\n" + _short_tb(exc),
                             Stage.REFERENCE)
                return False
            try:
                with torch.no_grad(), nan_fill(self._checks().nan_fill_on):
                    cand_out = self.cand_model(*_clone(inputs))
                self._sync()
            except Exception as exc:
                self._runtime_error(exc, f"ModelNew.forward raised on trial {t} (seed {seed})")
                self.rec["trials"].append({"trial": t, "seed": seed, "passed": False, "message": str(exc)[:500]})
                return False
            report = compare_outputs(cand_out, ref_out, self.cfg.atol, self.cfg.rtol)
            worst = report.worst
            trial = {
                "trial": t,
                "seed": seed,
                "passed": report.passed,
                "max_abs_err": report.max_abs_err,
                "mean_abs_err": report.mean_abs_err,
                "worst_index": worst.worst_index if worst else None,
                "worst_output": worst.name if worst else None,
                "frac_out_of_tol": max((l.frac_out_of_tol or 0.0) for l in report.leaves) if report.leaves else None,
                "message": report.message,
                "extra": {},
            }
            self._checks().judge_trial(t, inputs, cand_out, ref_out, report, trial)  # verdict mode, localisation
            self.rec["trials"].append(trial)
            if report.max_abs_err is not None:
                max_err = max(max_err, report.max_abs_err)
                mean_errs.append(report.mean_abs_err or 0.0)
            if not trial["passed"]:
                all_ok = False
                first_fail = first_fail or (t, seed, trial["message"])
        self.rec["max_abs_err"] = max_err if mean_errs else None
        self.rec["mean_abs_err"] = sum(mean_errs) / len(mean_errs) if mean_errs else None
        if not all_ok:
            t, seed, msg = first_fail
            n_fail = sum(1 for tr in self.rec["trials"] if not tr["passed"])
            self.verdict(
                Status.INCORRECT,
                f"{msg}\n  ({n_fail}/{self.cfg.trials} trials failed; first failing trial {t}, seed {seed})",
            )
        elif not self._checks().after_correctness():  # guards: a flag in fail_on sets the verdict
            all_ok = False
        self.stage_done("correctness_s")
        return all_ok

    def _timing(self) -> None:
        import torch

        from kernelwright.engine.child.timing import time_with_stability

        self.stage(Stage.TIMING)
        if not self._checks().before_timing():  # guards: patched timing functions
            return
        inputs = self._inputs(trial_seed(self.cfg.seed, 0))
        fns = {
            "candidate": lambda: self.cand_model(*inputs),
            "reference": lambda: self.ref_model(*inputs),
        }
        if self.cfg.timing.compare_compile:
            try:
                compiled = torch.compile(self.ref_model)
                with torch.no_grad():
                    compiled(*inputs)
                fns["compile_reference"] = lambda: compiled(*inputs)
            except Exception as exc:  # torch.compile unavailable (no compiler): say so, time the rest
                self.rec["metadata"]["compile_reference_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        try:
            with torch.no_grad():
                check = self._checks().timed_output_check()
                stats, timing_report = time_with_stability(fns, self.device, self.cfg.timing, check=check)  # [verdicts]
        except Exception as exc:
            from kernelwright.engine.child.build import CandidateBuildError

            if isinstance(exc, CandidateBuildError) or _is_triton_compile_error(exc):
                self._runtime_error(exc, "ModelNew failed while being timed")
            else:
                self._blame(exc, "ModelNew failed while being timed")  # [verdicts] timing code is engine code
            self.rec["correct"] = True  # correctness held; the failure is in timing
            return
        self.rec["metadata"]["timing"] = timing_report.to_dict()  # [verdicts] threads, load, drift, unstable
        if timing_report.unstable:  # [verdicts] a flag that never fails the verdict
            self._checks().flag("timing_unstable", "; ".join(timing_report.unstable))
            self._checks().publish()
        self.rec["candidate_timing"] = asdict(stats["candidate"])
        self.rec["reference_timing"] = asdict(stats["reference"])
        self.rec["candidate_ms"] = stats["candidate"].median_ms
        self.rec["reference_ms"] = stats["reference"].median_ms
        self.rec["speedup"] = stats["reference"].median_ms / stats["candidate"].median_ms
        if "compile_reference" in stats:
            self.rec["compile_reference_timing"] = asdict(stats["compile_reference"])
            self.rec["compile_reference_ms"] = stats["compile_reference"].median_ms
            self.rec["speedup_vs_compile"] = stats["compile_reference"].median_ms / stats["candidate"].median_ms
        with torch.no_grad():
            self._checks().after_timing(stats, inputs, fns["candidate"], check)  # guards on the timed runs
        self.stage_done("timing_s")


def _tail(text: str, n: int) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:])


def main(argv: list[str] | None = None) -> int:
    """`main.py JOB.json`, or `main.py --spare JOB.json`: a spare starts up (torch, CUDA), says
    `ready`, waits for a line on stdin, then re-reads JOB.json (now the real job) and runs it.
    EOF on stdin (nobody took it) ends it quietly."""
    argv = sys.argv[1:] if argv is None else argv
    faulthandler.enable()  # a segfault prints the Python stack to stderr, which the parent keeps
    spare = argv[0] == "--spare"
    job_path = argv[-1]
    with open(job_path) as f:
        job = json.load(f)
    chan = Channel(job.get("fd"))
    ev = Evaluation(job, chan)
    if spare:
        try:
            ev.startup()
            ev.warm_up()
        except Exception:  # the parent finds this spare dead and starts a fresh child for the job
            traceback.print_exc()
            os._exit(3)
        t_ready = time.perf_counter()
        chan.send("ready")
        if not sys.stdin.readline().strip():
            os._exit(0)
        with open(job_path) as f:
            ev.take(json.load(f))
        ev.t0 = time.perf_counter()
        ev.rec["metadata"]["prestarted"] = {"idle_s": round(ev.t0 - t_ready, 3),
                                            "startup_s": ev.rec["stage_times"].get("startup_s")}
        rec = ev.run()
    else:
        rec = ev.run()
    chan.record(rec, final=True)
    if job.get("record_path"):  # a run without the pipe (under ncu): the record as a file
        with open(job["record_path"], "w") as f:
            json.dump(rec, f, default=str)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running interpreter teardown: a candidate's extension may crash in it.
    os._exit(0)


if __name__ == "__main__":
    main()
