"""Where evaluations run: one small interface (`base.Executor`) that the loop and the suites use
and never look behind. `SerialExecutor` evaluates one task at a time in this machine's engine."""

from kernelwright.executors.base import EvalTask, Executor, SerialExecutor

__all__ = ["EvalTask", "Executor", "SerialExecutor"]
