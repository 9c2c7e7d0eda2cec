"""An evaluation worker process: `python -m kernelwright.executors.worker`, one per GPU.

It is trusted code (the engine, not a candidate): it keeps a `warm_pool.WarmPool` (spares
started ahead, at least two, so a start-up never waits on the GPU's path) and runs the tasks its
driver (`executors.local`) sends it, one at a time, each in the engine's own fresh, isolated child.
It talks JSON lines: tasks in on stdin, messages out on a private copy of stdout
(anything else printed goes to stderr, so nothing can corrupt the channel):

    in : {"config": {...}, "spares": 2, "startup_cpus": [...], "home_cpus": [...]}   first line
    in : {"key": ..., "problem": ..., "candidate_text": ..., "config": {...}, "report_dir": ...,
          "trusted_memo": {...}}                             the driver's prebuild, learned (optional)
    out: {"ready": PID}                                      once, after the first line
    out: {"stage": "build"}                                  each stage of the current evaluation
    out: {"result": {...}} | {"engine_error": "one line"}    one per task

EOF on stdin ends it (its spare child is stopped first). The driver tags the worker with
`KW_WORKER_TAG` and passes that name to the children, so the driver can stop a dead worker's
orphaned children (`executors.orphans`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main() -> None:
    # Ctrl-C reaches the whole foreground group: the executor that started this worker decides
    # (it kills the worker when the user stops), so the worker does not die on it with a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # print() of anything below lands on stderr, never on the channel

    def send(**msg) -> None:
        out.write(json.dumps(msg, default=str) + "\n")
        out.flush()

    from kernelwright.core.config import EvalConfig
    from kernelwright.engine import EngineError
    from kernelwright.engine.extensions import trusted_builds
    from kernelwright.executors.interface import EvalTask, run_task
    from kernelwright.executors.warm_pool import WarmPool

    first = sys.stdin.readline()
    if not first:
        return
    head = json.loads(first)
    config = EvalConfig.from_dict(head["config"])
    cpus = {k: set(head[k]) if head.get(k) else None for k in ("startup_cpus", "home_cpus")}
    # the first spare starts up alone, as a server's does: the worker's first task waits for it, and
    # a second spare starting beside it (python, torch and a CUDA context twice over) slows it, the
    # more so where every GPU's worker starts at once
    # a problem of N draws takes N spares (engine/draws.py): keep as many ready
    size = max(int(head.get("spares", 2)), config.timing.draws)
    warm = WarmPool(config, size=size, first_alone=True, **cpus)  # type: ignore[arg-type]
    send(ready=os.getpid())
    try:
        warm.prestart()  # the first evaluations' children start up while the first task comes
        for line in sys.stdin:
            if not line.strip():
                continue
            job = json.loads(line)
            if job.get("trusted_memo"):  # the driver built these calls: no builder needed here
                trusted_builds.adopt(job["trusted_memo"])
            task = EvalTask(
                key=job["key"],
                problem=Path(job["problem"]),
                candidate_text=job["candidate_text"],
                config=EvalConfig.from_dict(job["config"]),
                report_dir=Path(job["report_dir"]) if job.get("report_dir") else None,
            )
            try:
                result = run_task(warm.evaluate, task, config, lambda stage: send(stage=stage))
            except EngineError as exc:
                send(engine_error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
            send(result=result.to_dict())
    finally:
        warm.close()


if __name__ == "__main__":
    main()
