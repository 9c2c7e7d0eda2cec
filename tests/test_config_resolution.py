"""The configuration is resolved once, at an entry point (engine/config_resolution.py): "auto" becomes a
concrete device and sandbox there, and the engine refuses a raw "auto". Reading and checking a
configuration (`EvalConfig.from_dict`, `validate`) follows the dataclasses' own fields: one-line
errors that name the key and, for a value set, the values allowed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import ADD_ONE, CANDIDATES
from kernelwright.core.config import EvalConfig, GuardConfig, LoopConfig, ProfileConfig, StageTimeouts
from kernelwright.engine import EngineError, evaluate, prestart
from kernelwright.engine import config_resolution as resolution
from kernelwright.engine.config_resolution import resolve_config, resolve_device, resolve_sandbox
from kernelwright.engine.isolation import containment, sandbox

# ---- resolution ---------------------------------------------------------------------------------


# (asked, GPU device nodes present, torch sees a GPU) -> device, or the error's words
DEVICES = [
    ("auto", False, False, "cpu"),
    ("auto", True, True, "cuda"),
    ("auto", True, False, "cpu"),
    ("cpu", True, True, "cpu"),
    ("cuda", True, True, "cuda"),
    ("cuda", True, False, "no CUDA GPU is visible"),
]


@pytest.mark.parametrize(("asked", "nodes", "gpu", "expected"), DEVICES)
def test_device_resolution(monkeypatch, asked, nodes, gpu, expected):
    import torch

    monkeypatch.setattr(resolution.glob, "glob", lambda pattern: ["/dev/nvidia0"] if nodes else [])
    monkeypatch.setattr(resolution, "_gpu_without_torch", lambda: None)  # the driver cannot tell: torch is asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if expected in ("cpu", "cuda"):
        assert resolve_device(asked) == expected
    else:
        with pytest.raises(EngineError, match=expected):
            resolve_device(asked)


@pytest.mark.parametrize(
    ("version_py", "expected"),
    [
        ("cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", (13, 0)),
        ("cuda = '12.4'\n", (12, 4)),
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
        ("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.4'\n", None),  # ROCm: torch is asked
        ("__version__ = '2.13.0'\n", None),
    ],
)
def test_torchs_cuda_build_is_read_without_importing_it(monkeypatch, tmp_path, version_py, expected):
    import importlib.machinery

    (tmp_path / "version.py").write_text(version_py)
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(resolution.importlib.util, "find_spec", lambda name: spec)
    assert resolution._torch_cuda_build() == expected


class _FakeDriver:
    def __init__(self, init=0, version=13000, count=1):
        self.init, self.version, self.count = init, version, count

    def cuInit(self, flags):
        return self.init

    def cuDriverGetVersion(self, ref):
        ref._obj.value = self.version
        return 0

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return 0


@pytest.mark.parametrize(
    ("driver", "build", "expected"),
    [
        (_FakeDriver(), (13, 0), True),
        (_FakeDriver(count=0), (13, 0), False),
        (_FakeDriver(init=100), (13, 0), False),  # CUDA_ERROR_NO_DEVICE: none visible
        (_FakeDriver(init=3), (13, 0), None),  # CUDA_ERROR_NOT_INITIALIZED and the like: torch is asked
        (_FakeDriver(version=12080), (13, 0), None),  # a driver older than the build: torch decides
        (OSError("libcuda.so.1: cannot open shared object file"), (13, 0), False),
        (_FakeDriver(), False, False),  # a CPU build of torch never sees a GPU
    ],
)
def test_the_gpu_is_asked_of_the_driver_not_of_torch(monkeypatch, driver, build, expected):
    import sys

    def cdll(name):
        if isinstance(driver, OSError):
            raise driver
        return driver

    monkeypatch.setattr(resolution, "_torch_cuda_build", lambda: build)
    monkeypatch.setattr(resolution.ctypes, "CDLL", cdll)
    had_torch = "torch" in sys.modules
    assert resolution._gpu_without_torch() is expected
    assert ("torch" in sys.modules) == had_torch


# (asked, bwrap on PATH, why it cannot run ('' when it can)) -> sandbox, or the error's words
SANDBOXES = [
    ("none", True, "", "none"),
    ("auto", True, "", "bwrap"),
    ("auto", False, "", "none"),
    ("auto", True, "No permissions to create new namespace", "none"),
    ("bwrap", True, "", "bwrap"),
    ("bwrap", False, "", "needs bubblewrap: install it"),
    ("bwrap", True, "No permissions to create new namespace", "bubblewrap cannot run here"),
]


@pytest.mark.parametrize(("asked", "installed", "problem", "expected"), SANDBOXES)
def test_sandbox_resolution_keeps_the_bwrap_probe(monkeypatch, asked, installed, problem, expected):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/bwrap" if installed else None)
    monkeypatch.setattr(sandbox, "_bwrap_problem", lambda path: problem)
    if expected in ("bwrap", "none"):
        assert resolve_sandbox(asked) == expected
    else:
        with pytest.raises(EngineError, match=expected):
            resolve_sandbox(asked)


def test_resolve_config_returns_a_concrete_copy_and_leaves_the_callers_alone(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    asked = EvalConfig(device="cpu", trials=2)
    resolved = resolve_config(asked)
    assert (resolved.device, resolved.sandbox) == ("cpu", "none")
    assert asked.sandbox == "auto" and resolved.profile is not asked.profile  # the run can record what was asked
    assert resolve_config(resolved) == resolved  # resolving twice changes nothing
    with pytest.raises(EngineError, match="--trials must be at least 1"):
        resolve_config(dataclasses.replace(asked, trials=0))  # validated on the way


# ---- a raw "auto" below the entry points is an error ------------------------------------------


def test_the_engine_refuses_an_unresolved_configuration(cache_dir):
    raw = EvalConfig(device="cpu", cache_dir=cache_dir)  # sandbox left at auto
    with pytest.raises(EngineError, match="EvalConfig.sandbox is 'auto'.*resolve_config"):
        evaluate(ADD_ONE, CANDIDATES / "py_correct.py", raw)
    with pytest.raises(EngineError, match="EvalConfig.device is 'auto'"):
        prestart(dataclasses.replace(raw, device="auto", sandbox="none"))
    with pytest.raises(ValueError, match="resolve the configuration first"):
        containment.prepare("auto", "none", None)
    with pytest.raises(sandbox.SandboxUnavailable, match="unresolved"):
        sandbox.wrap(["true"], "auto", ADD_ONE.parent, [])


def test_the_child_refuses_an_unresolved_device():
    from kernelwright.engine.child.problem_io import torch_device as child_device

    assert child_device("cpu").type == "cpu"
    with pytest.raises(RuntimeError, match="unresolved"):
        child_device("auto")


# ---- from_dict and validate, derived from the fields -------------------------------------------


def test_from_dict_reads_back_what_to_dict_wrote_through_json():
    cfg = EvalConfig(
        device="cpu",
        sandbox="none",
        trials=2,
        pass_env=("A", "B"),
        memory_limit_mb=1024,
        timeouts=StageTimeouts(build=5),
        profile=ProfileConfig(tool="torch"),
        guards=GuardConfig(fail_on=("mutates_inputs",)),
    )
    back = EvalConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and isinstance(back.pass_env, tuple) and isinstance(back.timeouts, StageTimeouts)
    assert EvalConfig.from_dict({}) == EvalConfig()
    assert EvalConfig.from_dict({"timeouts": {"build": 7}}).timeouts.build == 7.0  # an int where a float goes


# (table, the one-line error)
FROM_DICT_ERRORS = [
    ({"device": "tpu"}, "'device' must be auto, cuda or cpu (got 'tpu')"),
    ({"sandbox": "docker"}, "'sandbox' must be auto, bwrap or none (got 'docker')"),
    ({"profile": {"tool": "nsys"}}, "'profile.tool' must be auto, ncu or torch (got 'nsys')"),
    ({"numerics": {"oracle_dtype": "float16"}}, "'numerics.oracle_dtype' must be float64 or float32 (got 'float16')"),
    ({"trials": "five"}, "'trials' must be int (got 'five')"),
    ({"memory_limit_mb": "lots"}, "'memory_limit_mb' must be int (got 'lots')"),
    ({"guards": {"fail_on": "mutates_inputs"}}, "'guards.fail_on' must be a list of strings (got 'mutates_inputs')"),
    ({"timeouts": 5}, "'timeouts' must be a table of StageTimeouts's fields (got 5)"),
    ({"colour": "red"}, "unknown key 'colour'; known: device, trials,"),
    ({"timing": {"warmup": 1}}, "unknown key 'timing.warmup'; known: warmup_ms, rep_ms,"),
]


@pytest.mark.parametrize(("table", "message"), FROM_DICT_ERRORS)
def test_from_dict_names_the_bad_key_and_what_it_must_be(table, message):
    with pytest.raises(ValueError) as info:
        EvalConfig.from_dict(table)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


# (the configuration, the one-line error): a top-level field is named as its command-line option
VALIDATE_ERRORS = [
    (EvalConfig(device="tpu"), "--device must be auto, cuda or cpu (got 'tpu')"),  # type: ignore[arg-type]
    (EvalConfig(sandbox="docker"), "--sandbox must be auto, bwrap or none (got 'docker')"),  # type: ignore[arg-type]
    (EvalConfig(verdict="loose"), "--verdict must be strict or calibrated (got 'loose')"),  # type: ignore[arg-type]
    (EvalConfig(shapes="sometimes"), "--shapes must be check, strict or off (got 'sometimes')"),  # type: ignore[arg-type]
    (EvalConfig(profile=ProfileConfig(tool="nsys")), "profile.tool must be auto, ncu or torch (got 'nsys')"),  # type: ignore[arg-type]
    (LoopConfig(backend="opencl"), "--backend must be cuda, triton or cpp (got 'opencl')"),  # type: ignore[arg-type]
    (EvalConfig(trials=0), "--trials must be at least 1 (got 0)"),
]


@pytest.mark.parametrize(("config", "message"), VALIDATE_ERRORS)
def test_validate_names_the_bad_key_and_the_values_allowed(config, message):
    with pytest.raises(ValueError) as info:
        config.validate()
    assert str(info.value) == message


def test_a_numerics_oracle_dtype_outside_its_set_is_refused_by_validate():
    cfg = EvalConfig()
    cfg.numerics.oracle_dtype = "float16"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"^numerics.oracle_dtype must be float64 or float32 \(got 'float16'\)$"):
        cfg.validate()
