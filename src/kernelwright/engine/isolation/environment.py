"""What the evaluation child may see of the caller's environment: an allow-list, minus secrets
(`child_environment`), and the environment an evaluation or prebuild child gets (`child_env`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import kernelwright
from kernelwright.core.config import EvalConfig
from kernelwright.core.printable import map_strings
from kernelwright.engine.child import heap, jsoncache

# Names passed through as they are (exact names, or prefixes ending in "_").
_ALLOWED_EXACT = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "SHELL",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "CC",
    "CXX",
    "CUDAHOSTCXX",
    "MAX_JOBS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTHONHASHSEED",
}
_ALLOWED_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "NVSHMEM_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "NVCC_",
    "CUBLAS_",
    "CUDNN_",
)
# Never passed, whatever the allow-list says: anything that names a credential.
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET.search(name))


def child_environment(
    parent: Mapping[str, str] | None = None,
    extra_names: Iterable[str] = (),
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an evaluation child: allow-listed names of the parent, no secrets."""
    parent = os.environ if parent is None else parent
    extra = set(extra_names)
    env = {}
    for name, value in parent.items():
        allowed = name in _ALLOWED_EXACT or name.startswith(_ALLOWED_PREFIXES) or name in extra
        if allowed and not is_secret_name(name):
            env[name] = value
    env.update(overrides or {})
    return env


REDACTED = "[redacted]"
_MIN_SECRET_LEN = 6


def secret_values(parent: Mapping[str, str] | None = None) -> list[str]:
    """The values of the caller's secret-looking variables (longest first): what must never leave
    the engine in a record, a log or a prompt, whatever the candidate managed to read."""
    parent = os.environ if parent is None else parent
    vals = {v for k, v in parent.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(vals, key=len, reverse=True)


def redact(obj, values: list[str]):
    """`obj` (a string, or JSON-like data) with every secret value replaced by [redacted]."""
    if not values:
        return obj

    def blank(text: str) -> str:
        for v in values:
            if v in text:
                text = text.replace(v, REDACTED)
        return text

    return map_strings(obj, blank)


def _package_root() -> str:
    return str(Path(kernelwright.__file__).resolve().parent.parent)


def child_env(config: EvalConfig, tmp: Path) -> dict[str, str]:
    """The scrubbed environment of an evaluation (or prebuild) child; `tmp` is its TMPDIR, and its
    JIT caches (Triton's, CUDA's) lie in it: a cache shared between evaluations would let one
    candidate plant a kernel under the key of another's."""
    env = child_environment(
        extra_names=config.pass_env,
        overrides={
            "PYTHONPATH": _package_root(),
            "TMPDIR": str(tmp),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            "CUDA_CACHE_PATH": str(tmp / "nv"),  # the CUDA JIT cache: $HOME is read-only in the sandbox
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONFAULTHANDLER": "1",
        },
    )
    # ninja's parallelism: every core unless the config or the caller's MAX_JOBS says otherwise
    if config.build.max_jobs > 0:
        env["MAX_JOBS"] = str(config.build.max_jobs)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    # a worker pinned to one GPU (an executor's) pins its children to it
    if config.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = config.visible_devices
    if config.device == "cpu":  # read by glibc when the process starts: see engine/child/heap.py
        env["GLIBC_TUNABLES"] = heap.with_tunable(env.get("GLIBC_TUNABLES", ""), heap.NO_TCACHE)
    return env


def candidate_writable(config: EvalConfig) -> list[Path]:
    """What a sandboxed child that runs candidate code may write in the cache directory, besides its
    own directory: the shared builds where no trusted builder keeps them (`build.trusted_cache`
    off), else nothing. Not the cache as a whole: a trusted process reads there (the trusted
    builds' memos, the judge's caches). Created here: bwrap binds only what exists."""
    if config.build.trusted_cache:
        return []
    builds = Path(config.cache_dir) / "builds"
    builds.mkdir(parents=True, exist_ok=True)
    return [builds]


JUDGE_CACHE_SUBDIR = jsoncache.JUDGE_CACHE_SUBDIR  # in the cache: the judge's, read-only in the runner's sandbox


def judge_env(runner_env: dict[str, str], config: EvalConfig, judge_dir: Path) -> dict[str, str]:
    """The judge's environment: the runner's, with its files in its own directory and its compiler
    caches (Triton's, CUDA's JIT, inductor's for `compare_compile`) where no runner writes: a kernel
    planted under the key of the reference's compiled kernel would be the judge's reference."""
    own = Path(config.cache_dir) / JUDGE_CACHE_SUBDIR
    return dict(
        runner_env,
        TMPDIR=str(judge_dir),
        TRITON_CACHE_DIR=str(own / "triton"),
        CUDA_CACHE_PATH=str(own / "nv"),
        TORCHINDUCTOR_CACHE_DIR=str(own / "inductor"),
    )
