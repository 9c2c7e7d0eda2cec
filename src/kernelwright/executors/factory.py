"""From `--executor serial|local|ray` (with `--gpus` and `--ray-address`) to an executor."""

from __future__ import annotations

from kernelwright.core.config import EvalConfig
from kernelwright.executors.interface import Executor, SerialExecutor

KINDS = ("serial", "local", "ray")


def make_executor(
    kind: str,
    config: EvalConfig,
    gpus: list[str] | None = None,
    ray_address: str | None = None,
    build_workers: int | None = None,
) -> Executor:
    """Raises ValueError (bad option) or EngineError (Ray missing or unreachable), one line each."""
    if kind == "serial":
        if gpus and len(gpus) > 1:
            raise ValueError(f"--executor serial uses one GPU; --gpus names {len(gpus)}: use --executor local")
        if gpus:
            from dataclasses import replace

            from kernelwright.executors.placement import refuse_unseen

            if config.device != "cpu":  # its child's CUDA_VISIBLE_DEVICES is the entry, as a local worker's
                refuse_unseen(gpus)
            config = replace(config, visible_devices=gpus[0])
        return SerialExecutor(config)
    if kind == "local":
        from kernelwright.executors.local import LocalExecutor

        return LocalExecutor(config, gpus=gpus, build_workers=build_workers)
    if kind == "ray":
        from kernelwright.executors.ray_executor import RayExecutor

        return RayExecutor(config, address=ray_address, workers=len(gpus) if gpus else None, build=build_workers != 0)
    raise ValueError(f"--executor must be one of {', '.join(KINDS)} (got {kind!r})")
