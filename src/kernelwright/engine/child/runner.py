"""The runner: the one process that imports and runs the candidate. It produces data, never a verdict.

`python -m kernelwright.engine.child.runner JOB.json` (or `--spare JOB.json`). It builds and imports
the candidate, constructs ModelNew, runs it on each trial's and the guards' inputs and in the judge's
timing windows, and writes every output for the judge (`wire.write_tree`, the device hand-off).
What it reports is input to the judge and the parent, never trusted: the candidate runs in this
process and can write anything here. Modes: `evaluate` (the default), `build_only` (a prebuild) and
`profile_only` (under Nsight Compute). Imports only torch, the standard library and `kernelwright.core`.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import errno
import faulthandler  # noqa: E402
import json
import os
import select
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kernelwright.core.config import EvalConfig
from kernelwright.engine.child import heap, protocol
from kernelwright.engine.child.channel import Channel
from kernelwright.engine.child.faults import is_triton_compile_error, short_tb, tail

if TYPE_CHECKING:
    import socket

    import torch

    from kernelwright.engine.child.build import CandidateBuildError


class Stop(Exception):
    """The parent said stop (or closed our stdin): leave quietly."""


class Runner:
    def __init__(self, job: protocol.RunnerJob | dict[str, Any], chan: Channel):
        self.job = job if isinstance(job, protocol.RunnerJob) else protocol.RunnerJob.from_json(job)
        self.chan = chan
        self.cfg = EvalConfig.from_dict(self.job.config)
        self.meta: dict[str, Any] = {}
        self.out_dir = self.job.out_dir or os.getcwd()
        self._n_files = 0
        self._handoff_off = ""  # why device outputs go into the files instead ('' while they need not)
        # the runner's end of the device hand-off socket, opened at first use
        self._handoff_sock: socket.socket | None = None
        self.started = False
        self.phases: dict[str, float] = {}  # seconds per phase of the runner's own work (sent with the timing)
        self.models: dict[str, Any] = {}  # ModelNew built for other sizes of the problem, by label (shapes.py)
        self._device_lost = ""  # why calls at other sizes cannot run any more ('' while they can)
        self._builds_reported: int | None = None  # entries of the build log sent to the judge so far

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
        elif is_triton_compile_error(exc):
            self.fail("compile_error", f"{what}: Triton compilation failed:\n" + short_tb(exc), stage)
        else:
            self.fail("runtime_error", f"{what}:\n" + short_tb(exc), stage)

    def blame(self, exc: BaseException, what: str = "", stage: str = "correctness") -> None:
        """Whose fault an exception that escaped engine code is (engine/child/faults.py)."""
        from kernelwright.engine.child import faults

        model = getattr(self, "cand_model", None)
        objs = tuple(model.modules()) if model is not None else ()
        device = getattr(self, "device", None)
        b = faults.classify(
            exc,
            device.type if device is not None else "cpu",
            self.job.problem_path,
            short_tb(exc),
            candidate_objects=objs,
        )
        status = b.status.value
        log = (f"{what}:\n" if what and status == "runtime_error" else "") + b.log
        self.chan.send(
            "failure", status=status, log=log, stage=stage, engine_traceback=b.metadata.get("engine_traceback")
        )

    def write(self, label: str, obj: Any) -> str:
        from kernelwright.engine.child.wire import write_tree

        self._n_files += 1
        name = f"out_{self._n_files:03d}_{label}.kwt"
        dirs = [self.out_dir] + ([self.job.spill_dir] if self.job.spill_dir else [])
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
            self.fail(
                "runtime_error",
                f"The candidate's process could not write its output ({exc.strerror}): "
                "something in it replaced or blocked the engine's output files",
                "correctness",
            )
            raise Stop() from exc
        return name

    def shipper(self, name: str) -> Callable[[int, torch.Tensor], bool] | None:
        """How the bytes of this output's CUDA tensors reach the judge: on the device, beside the
        file (`device_handoff`), when the configuration allows it and this machine can export;
        None (in the file) otherwise or after the first failure."""
        if (
            not self.cfg.device_handoff
            or getattr(self, "device", None) is None
            or self.device.type != "cuda"
            or self._handoff_off
        ):
            return None
        sock = self.pair_socket()
        if sock is None:
            return None
        from kernelwright.engine.child import device_handoff

        def ship(i: int, t: torch.Tensor) -> bool:
            if self._handoff_off or t.device.type != "cuda":
                return False
            try:
                device_handoff.send(sock, f"{name}#{i}#{t.numel() * t.element_size()}", t)
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

        from kernelwright.engine.child.problem_io import device_name, torch_device

        self.stage("startup")
        if self.job.mode == "build_only":
            self.device = torch.device("cpu")  # compilation needs no GPU
        else:
            self.device = torch_device(self.cfg.device)
        if self.device.type == "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            from kernelwright.core.arch import arch_list_for

            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list_for(*torch.cuda.get_device_capability(self.device))
        self.chan.send(
            "startup",
            device=device_name(self.device),
            device_type=self.device.type,
            startup_s=time.perf_counter() - _T0,
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            python=sys.version.split()[0],
        )
        self.started = True

    def warm_up(self) -> None:
        """A spare's extra start-up: the device context, the build machinery, the engine's modules;
        nothing of the engine's tools that takes device memory. A process that made an exportable
        allocation or opened a profiler session before the candidate's weights, inputs and first
        call ran CUDA-L1's level1/77 at 1.41 ms a call against a plain process's 1.30 (H200,
        docs/PERFORMANCE.md): the hand-off's probe waits for that call (`warm_tools`), the first
        profiler session (seconds) for the guards' tracer, while the judge checks the trials."""
        import torch
        import torch.utils.cpp_extension  # noqa: F401

        from kernelwright.engine.child import build, compare, evidence, faults, guards, wire  # noqa: F401
        from kernelwright.engine.child.timing import stability, summary  # noqa: F401

        if self.device.type == "cuda":
            torch.empty(1, device=self.device)
            torch.cuda.synchronize(self.device)
        self._tools_cold = True

    def warm_tools(self) -> None:
        """A spare's, once, after the candidate's first call: can this machine export device outputs?"""
        cold, self._tools_cold = getattr(self, "_tools_cold", False), False
        if cold and self.device.type == "cuda" and isinstance(self.job.handoff_fd, int):
            from kernelwright.engine.child import device_handoff

            why = device_handoff.probe(self.device)
            if why:
                self._handoff_off = why
                self.meta["device_handoff_off"] = why

    def run(self) -> None:
        try:
            if not self.started:
                self.startup()
            if not self.build():
                return
            mode = self.job.mode
            if mode == "build_only":
                self.chan.send("built")
                return
            if mode == "profile_only":
                self.profile_forwards()
                return
            self.serve()
        except Stop:
            return
        except Exception as exc:  # the candidate's error, a CUDA error it left, or the engine's own
            self.blame(exc)
        finally:
            self.chan.send("done")

    def build(self) -> bool:
        from kernelwright.engine.child import build, guards
        from kernelwright.engine.child.problem_io import load_module

        self.stage("build")
        build.install_build_cache(
            os.path.join(self.cfg.cache_dir, "builds"),
            self.job.candidate_path,
            use_pch=self.cfg.build.use_pch,
            lean_headers=self.cfg.build.lean_headers,
            # load only verified artefacts of the shared cache, build the rest privately
            verified=self.job.verified_builds,
            private_root=self.job.private_builds or None,
            failed=self.job.failed_builds,
        )
        self.snapshot = guards.FunctionSnapshot() if self.cfg.guards.enabled else None
        self.threads_at_start = guards.python_threads()
        ok = True
        try:
            self.candidate = load_module(self.job.candidate_path, "kw_candidate")
        except build.CandidateBuildError as exc:
            self.compile_error(exc)
            ok = False
        except SyntaxError as exc:
            self.fail("format_error", f"SyntaxError: {exc.msg} (line {exc.lineno})", "build")
            ok = False
        except Exception as exc:
            if is_triton_compile_error(exc):
                self.fail("compile_error", short_tb(exc), "build")
            else:
                self.fail("runtime_error", "The candidate raised while being imported:\n" + short_tb(exc), "build")
            ok = False
        self.report_builds()
        if not ok:
            return False
        if self.failed_build("build", caught=True):  # the candidate swallowed its own build error
            return False
        if not hasattr(self.candidate, "ModelNew"):
            self.fail(
                "format_error", "The candidate defines no class ModelNew; define class ModelNew(nn.Module)", "build"
            )
            return False
        self.chan.send("compiled")
        return True

    def report_builds(self) -> bool:
        """Send the judge the build log, where it has grown since it was last sent: the import's
        builds, then those made in `ModelNew.__init__` or at the first call. Whether it had grown."""
        from kernelwright.engine.child import build

        if self._builds_reported == len(build.BUILD_LOG):
            return False
        self._builds_reported = len(build.BUILD_LOG)
        builds = [{k: v for k, v in b.items() if k not in ("output", "issues")} for b in build.BUILD_LOG]
        self.chan.send("build", builds=builds)
        return True

    def failed_build(self, stage: str, caught: bool) -> bool:
        """The first build of the log that failed, sent as `compile_error` (`caught`: the candidate
        went on with a fallback): one rule wherever the build was made, at import, in `__init__` or
        at a call (docs/VERDICTS.md). Whether there was one."""
        from kernelwright.engine.child import build

        b = next((b for b in build.BUILD_LOG if b.get("ok") is False and "output" in b), None)
        if b is None:
            return False
        exc = build.CandidateBuildError(b["name"], b["output"], [])
        self.compile_error(exc, issues=b["issues"], caught=caught, stage=stage)
        return True

    def build_failure_after_import(self, exc: BaseException | None, stage: str) -> None:
        """After `ModelNew.__init__` or a correctness call: builds made there are reported, and one
        that failed ends the evaluation as `compile_error`, caught (`exc` None) or not (`exc` the
        build's error, or what the candidate raised after it)."""
        from kernelwright.engine.child import build

        if not self.report_builds():
            return
        if isinstance(exc, build.CandidateBuildError):
            self.compile_error(exc, stage=stage)
            raise Stop()
        # it raised something else after a build failed (its own wrapper): still that build's
        if self.failed_build(stage, caught=exc is None):
            raise Stop()

    def compile_error(
        self,
        exc: CandidateBuildError,
        issues: list[dict[str, Any]] | None = None,
        caught: bool = False,
        stage: str = "build",
    ) -> None:
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
            summary = (
                "The candidate caught this build failure and would have run PyTorch instead (its fallback "
                "is not evaluated: the extension it meant to use did not build).\n" + summary
            )
        self.chan.send(
            "failure",
            status="compile_error",
            stage=stage,
            compile_issues=issues[:50],
            caught=caught,
            log=summary + "\n\nCompiler output (end):\n" + tail(exc.output, 60),
        )

    # ---- the judge's commands -----------------------------------------------------------------------
    def serve(self) -> None:
        """Answer the judge's commands until it says stop: stdin (through the parent) for the
        checks, the pair's socket for timing windows."""
        from kernelwright.engine.child import protocol

        self.chan.send("await")
        while True:
            cmd, window = self.next_command()
            if window is not None:
                self.window(*window)
                continue
            match cmd:
                case None:
                    continue
                case protocol.Stop():
                    raise Stop()
                case protocol.Construct():
                    self.construct(cmd)
                case protocol.Call():
                    self.call_cmd(cmd)
                case protocol.Guards():
                    self.guarded_calls(cmd)
                case protocol.Ablate():
                    self.ablate(cmd)
                case protocol.Profile():
                    self.evidence(cmd)

    def next_command(self) -> tuple[protocol.Command | None, tuple[dict[str, Any], list[int]] | None]:
        """(command, None) from stdin, or (None, (header, fds)) for a window on the socket."""
        from kernelwright.engine.child import protocol, shared_region
        from kernelwright.engine.child.timing import window_io

        buf = getattr(self, "_stdin_buf", b"")
        while b"\n" not in buf:
            sock = self.pair_socket()
            fds = [0] + ([sock.fileno()] if sock is not None else [])
            # between the wall clock's timing windows on a GPU, polled (the next window's hand-over
            # without a wake-up); not on the device clock, whose span holds no hand-over: a polling
            # process there only takes a core from the judge's calls and the runner's own launches
            spin = window_io.SPIN_S if getattr(self, "_spin_windows", False) and self.device.type == "cuda" else 0.0
            ready = window_io.wait_readable(fds, None, spin)
            if sock is not None and sock.fileno() in ready:
                data, got = shared_region.recv(sock)
                if not data:  # the judge closed its end: nothing more will come that way
                    self._sock_closed = True
                    for fd in got:
                        os.close(fd)
                    continue
                try:
                    header = json.loads(data.decode(errors="replace"))
                except ValueError:
                    header = None
                if isinstance(header, dict) and "window" in header and len(got) <= 3:
                    self._stdin_buf = buf
                    return None, (header, got)
                for fd in got:
                    os.close(fd)
                continue
            if 0 in ready:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    raise Stop()
                buf += chunk
        line, self._stdin_buf = buf.split(b"\n", 1)
        for lent in (getattr(self, "_rings", None), getattr(self, "_lent", None)):
            if lent is not None:  # the windows are over: the regions go back to the judge
                lent.close()
        return protocol.parse_command(line.decode(errors="replace")), None

    def pair_socket(self) -> socket.socket | None:
        fd = self.job.handoff_fd
        if not isinstance(fd, int) or getattr(self, "_sock_closed", False):
            return None
        if self._handoff_sock is None:
            import socket

            try:
                self._handoff_sock = socket.socket(fileno=fd)
            except OSError:
                self._sock_closed = True
                return None
        return self._handoff_sock

    def read_inputs(self, name: str) -> Any:
        from kernelwright.engine.child import protocol
        from kernelwright.engine.child.wire import WireError, read_tree

        safe = protocol.safe_name(name)
        if safe is None:
            raise Stop()
        try:
            return read_tree(os.path.join(self.out_dir, safe), self.device)
        except WireError as exc:
            # the judge writes its input files whole before it names them; this directory is the
            # candidate's to write too, so a file that no longer reads as written was changed here
            self.fail(
                "runtime_error",
                f"The judge's input file {safe} was changed in the evaluation's directory before it was "
                f"read ({exc}); only code in the candidate's process writes there",
                "correctness",
            )
            raise Stop() from None

    def construct(self, cmd: protocol.Construct) -> None:
        if cmd.label:
            return self.construct_other(cmd)
        self.stage("init")
        try:
            self.cand_model = self.new_model(self.read_inputs(cmd.init), cmd.seed, cmd.mode)
            self.sync()
        except Stop:
            raise
        except Exception as exc:
            self.build_failure_after_import(exc, "init")  # a build of __init__ that failed: compile_error
            self.runtime_error(exc, "ModelNew failed to construct", "init")
            raise Stop() from None
        self.build_failure_after_import(None, "init")
        self.patches("at import or construction")
        self.chan.send("constructed")

    def new_model(self, init: Any, seed: int, mode: str = "") -> Any:
        """ModelNew built as the judge builds the reference: seeded, on the device, in the mode of both."""
        import torch

        from kernelwright.engine.child.problem_io import in_mode  # torch's, loaded lazily

        torch.manual_seed(seed)
        init = list(init) if isinstance(init, (list, tuple)) else [init]
        return in_mode(self.candidate.ModelNew(*init).to(self.device), mode or self.cfg.model_mode)

    def construct_other(self, cmd: protocol.Construct) -> None:
        """One more ModelNew, for other sizes of the problem: a failure is that size's, not the verdict's."""
        if self._device_lost:
            self.chan.send("call_error", label=cmd.label, probe=True, lost=True, message=self._device_lost)
            return
        try:
            self.models[cmd.label] = self.new_model(self.read_inputs(cmd.init), cmd.seed, cmd.mode)
            self.sync()
        except Stop:
            raise
        except Exception as exc:
            self.chan.send(
                "call_error",
                label=cmd.label,
                probe=True,
                message=f"ModelNew failed to construct: {type(exc).__name__}: {str(exc)[:400]}",
            )
        self.patches("at construction")

    def sync(self) -> None:
        from kernelwright.engine.child import faults

        faults.sync_and_check(self.device)  # a pending CUDA error surfaces here, as the candidate's

    def patches(self, when: str) -> None:
        """Report (and undo) any patch of timing, verifier or torch functions (evidence only)."""
        if self.snapshot is None:
            return
        changed = self.snapshot.changed()
        if changed:
            self.snapshot.restore()
            self.chan.send("patched", names=changed[:50], when=when)

    def call(self, inputs: Any, nan_fill: bool = True, model: Any = None) -> Any:
        import torch

        from kernelwright.engine.child import guards
        from kernelwright.engine.child.trees import clone

        with torch.no_grad(), guards.nan_fill(nan_fill and self.cfg.guards.enabled and self.cfg.guards.nan_fill):
            out = (self.cand_model if model is None else model)(*clone(inputs))
        self.sync()
        return out

    def call_cmd(self, cmd: protocol.Call) -> None:
        if cmd.probe:
            return self.probe(cmd)
        if not getattr(self, "_in_correctness", False):
            self._in_correctness = True
            self.stage("correctness")
        t0 = time.perf_counter()
        inputs = self.read_inputs(cmd.inputs)
        t0 = self.phase("inputs_read", t0)
        try:
            if not getattr(self, "_settled", False):
                # the first call makes one-time choices (a format race, cuDNN's autotune): made as
                # timed (no deterministic mode, no NaN fill), not under the checks. Output unused.
                self._settled = True
                self.call(inputs, nan_fill=False)
                self.warm_tools()
            out = self.call(inputs, cmd.nan_fill)
        except Exception as exc:
            self.build_failure_after_import(exc, "correctness")  # a build at the call that failed
            self.runtime_error(exc, f"ModelNew.forward raised on {cmd.label}", "correctness")
            self.chan.send("call_error", label=cmd.label, message=str(exc)[:500])
            raise Stop() from None
        self.build_failure_after_import(None, "correctness")  # built at the first call, and caught
        t0 = self.phase("calls", t0)
        self.chan.send("output", label=cmd.label, file=self.write(cmd.label, out))
        self.phase("output_writes", t0)
        self.patches("while ModelNew ran")

    def probe(self, cmd: protocol.Call) -> None:
        """A call at another size of the problem (`shapes.py`): its output, or its error as a
        `call_error` under its label; either way the runner goes on."""
        import torch

        if self._device_lost:  # a sticky CUDA error at an earlier size: nothing can run here
            self.chan.send("call_error", label=cmd.label, probe=True, lost=True, message=self._device_lost)
            return
        model = self.models.get(cmd.model) if cmd.model else self.cand_model
        try:
            if model is None:
                raise RuntimeError("no ModelNew was constructed for these sizes")
            out = self.call(self.read_inputs(cmd.inputs), cmd.nan_fill, model)
            name = self.write(cmd.label, out)
        except Stop:
            raise
        except Exception as exc:
            message = f"{type(exc).__name__}: {str(exc)[:400]}"
            self.chan.send("call_error", label=cmd.label, probe=True, message=message)
            if self.device.type == "cuda":
                try:
                    torch.cuda.synchronize(self.device)
                except Exception:
                    self._device_lost = f"not run: the CUDA context was lost at an earlier size ({message[:200]})"
        else:
            self.chan.send("output", label=cmd.label, file=name)
        self.patches("while ModelNew ran")

    def guarded_calls(self, cmd: protocol.Guards) -> None:
        """The calls the judge's guards read: outputs of one traced call, the inputs after it, the
        output after the same tensors were refilled with new values, and the first output again."""
        import torch

        from kernelwright.engine.child import build, guards

        t_start = time.perf_counter()
        inputs = self.read_inputs(cmd.inputs)
        candidate_text = ""
        try:
            with open(self.job.candidate_path) as f:
                candidate_text = f.read()
        except OSError:
            pass
        ext_names = {b["name"] for b in build.BUILD_LOG if b.get("name")}
        ext_dirs = [b["dir"] for b in build.BUILD_LOG if b.get("dir")]
        tracer = guards.CallTracer(
            self.job.problem_path or "",
            self.job.candidate_path,
            ext_names,
            ext_dirs,
            candidate_text,
            self.cfg.guards.profile_kernels,
            self.device,
        )
        nan = self.cfg.guards.nan_fill
        with torch.no_grad(), guards.nan_fill(nan):
            out_a = tracer.run(lambda: self.cand_model(*inputs))  # the same tensors: mutation shows
        self.sync()
        self.patches("while ModelNew ran")
        facts = {k: v for k, v in vars(tracer.facts).items() if v}
        facts["custom_kernel"] = tracer.facts.custom_kernel
        files = {"out_a": self.write("guard_a", out_a), "inputs_after": self.write("guard_inputs", inputs)}
        in_keys = {guards.storage_key(x): n for n, x in guards.tensors(inputs)}
        facts["aliases"] = [
            [n, in_keys[guards.storage_key(o)]] for n, o in guards.tensors(out_a) if guards.storage_key(o) in in_keys
        ]
        if cmd.refill:
            guards.refill_in_place(inputs, self.read_inputs(cmd.refill))
            with torch.no_grad(), guards.nan_fill(nan):
                out_b = self.cand_model(*inputs)
            self.sync()
            files["out_refill"] = self.write("guard_refill", out_b)
            files["out_a_again"] = self.write("guard_a_again", out_a)
            del out_b
        new_threads = [t for t in guards.python_threads() - self.threads_at_start if t.is_alive()]
        facts["threads"] = [t.name for t in new_threads[:5]]
        facts["autotunes"] = guards.autotuning()
        self.phase("guarded_calls", t_start)
        self.chan.send("guards", files=files, facts=facts)

    def ablate(self, cmd: protocol.Ablate) -> None:
        """Each named parameter zeroed in ModelNew in turn, the output on `inputs` written (the
        judge compares it with its own reference with the same parameter zeroed)."""
        import torch

        inputs = self.read_inputs(cmd.inputs)
        params = dict(self.cand_model.named_parameters())
        files: dict[str, str] = {}
        t0 = time.perf_counter()
        for name in cmd.params[:8]:
            p = params.get(name)
            if p is None or not p.is_floating_point() or time.perf_counter() - t0 > 3.0:
                continue
            saved = p.detach().clone()
            try:
                with torch.no_grad():
                    p.zero_()
                out = self.call(inputs, nan_fill=False)
                files[name] = self.write(f"ablate{len(files)}", out)
            except Stop:
                raise
            except Exception:
                pass
            finally:
                with torch.no_grad():
                    p.copy_(saved)
        self.chan.send("ablation", files=files)

    def window(self, header: dict[str, Any], fds: list[int]) -> None:
        """A timing window the judge opened on the socket (its clock, its inputs; see engine/child/timing/)."""
        from kernelwright.engine.child.timing import device_clock, runner_window

        if not getattr(self, "_in_timing", False):
            self._in_timing = True
            self.stage("timing")
        try:
            sock = self.pair_socket()
            assert sock is not None  # the window came on it
            self._spin_windows = header.get("clock") != "device"
            if header.get("clock") == "device":
                if getattr(self, "_lent", None) is None:
                    self._lent = device_clock.Lent()
                device_clock.serve(sock, header, fds, self.cand_model, self.device, 1 << 40, self._lent)
            else:
                if getattr(self, "_rings", None) is None:
                    self._rings = runner_window.Rings()
                runner_window.serve_window(
                    sock, header, fds, self.cand_model, self.device, max_bytes=1 << 40, rings=self._rings
                )
        except Exception as exc:
            self.blame(exc, "ModelNew failed in a timing window", "timing")
            raise Stop() from None
        self.patches("during timing")

    def evidence(self, cmd: protocol.Profile) -> None:
        from kernelwright.core.kernel_names import candidate_texts
        from kernelwright.engine.child import build, evidence

        self.stage("profile")
        inputs = self.read_inputs(cmd.inputs)
        out: dict[str, Any] = {}
        build_dirs = [b["dir"] for b in build.BUILD_LOG if b.get("dir")]
        try:
            out["profile"] = evidence.torch_profile(
                self.cand_model,
                inputs,
                self.device,
                candidate_texts(self.job.candidate_path, build_dirs),
                build_dirs,
                build.BUILT_MODULES,
                self.candidate,
            )
        except Exception as exc:
            out["profile_error"] = f"torch.profiler failed: {type(exc).__name__}: {str(exc)[:300]}"
        self.chan.send("evidence", metadata=out)

    def profile_forwards(self) -> None:
        """`profile_only` (under ncu): construct ModelNew, run the forward; nothing else launches kernels."""
        import torch

        from kernelwright.engine.child.wire import read_tree

        self.stage("profile")
        try:
            inputs = read_tree(self.job.inputs_path, self.device)
            model = self.new_model(read_tree(self.job.init_path, self.device), self.cfg.seed)
            with torch.no_grad():
                for _ in range(self.cfg.profile.forward_runs):
                    model(*inputs)
            self.sync()
        except Exception as exc:
            self.runtime_error(exc, "ModelNew failed while being profiled", "profile")
            return
        self.chan.send("profiled")


def _read_job(path: str) -> protocol.RunnerJob:
    """The job file the parent wrote, typed and checked; a malformed one ends the runner (exit 2)."""
    try:
        with open(path) as f:
            return protocol.RunnerJob.from_json(json.load(f))
    except (OSError, ValueError) as exc:  # JobError is a ValueError
        print(f"runner: unreadable job {path}: {exc}", file=sys.stderr, flush=True)
        os._exit(2)


def main(argv: list[str] | None = None) -> int:
    """`runner.py JOB.json`, or `runner.py --spare JOB.json`: a spare starts up, says `ready`, waits
    for a line on stdin, then re-reads JOB.json (now the real job) and runs it."""
    argv = sys.argv[1:] if argv is None else argv
    faulthandler.enable()
    heap.keep_freed_memory()  # as the other side does: a timed window's outputs reuse the heap
    heap.keep_tunables_to_itself()
    spare = argv[0] == "--spare"
    job_path = argv[-1]
    job = _read_job(job_path)
    chan = Channel(job.fd, job.record_path or None)
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
        job = _read_job(job_path)
        runner.job = job
        runner.cfg = EvalConfig.from_dict(job.config)
        runner.out_dir = job.out_dir or os.getcwd()
        chan.send("prestarted", idle_s=round(time.perf_counter() - t_ready, 3), startup_s=t_ready - _T0)
    runner.run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a candidate's extension may crash in it


if __name__ == "__main__":
    main()
