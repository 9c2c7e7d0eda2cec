"""Where evaluations run: one small interface (`base.Executor`) that the loop and the suites use
and never look behind. `SerialExecutor` evaluates one task at a time in this machine's engine;
`local.LocalExecutor` runs a worker per GPU of this machine; `ray_executor.RayExecutor` a Ray
cluster. `make_executor` picks one from the command line's options."""

from kernelwright.executors.factory import make_executor
from kernelwright.executors.interface import EvalTask, Executor, SerialExecutor, WorkerLost

__all__ = ["EvalTask", "Executor", "SerialExecutor", "WorkerLost", "make_executor"]
