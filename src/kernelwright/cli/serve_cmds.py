"""`kernelwright serve`: a server of warm evaluations for one device (`executors/eval_server.py`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from kernelwright.cli.entry import fail, resolved, settings

err = Console(stderr=True)


def serve_cmd(
    device: str = typer.Option(
        None, metavar="cuda|cpu|auto", help="Device (default auto: cuda when a GPU is visible)."
    ),
    sandbox: str = typer.Option(None, metavar="auto|bwrap|none", help="Isolation of the evaluations (default auto)."),
    spares: int = typer.Option(2, metavar="N", help="Evaluations kept started up ahead of their jobs."),
    idle_minutes: float = typer.Option(
        30.0, "--idle-minutes", metavar="MIN", help="Stop after this long without a job (0: never)."
    ),
    config: Path = typer.Option(
        None, "--config", metavar="FILE", dir_okay=False, help="Settings file (default: as `kernelwright eval`)."
    ),
    stop: bool = typer.Option(
        False,
        "--stop",
        help="Stop the running server for the device (one that `kernelwright eval` started, or this command's).",
    ),
) -> None:
    """Serve `kernelwright eval` of this user on warm evaluations for one device, until Ctrl-C.

    Each eval hands its job here (--no-server: never) and gets the same record, from a fresh runner and judge.
    """
    from kernelwright.executors.eval_server import EvalServer, run_server, stop_server

    if stop:
        cfg = resolved(settings(config, {"eval": {"device": device, "sandbox": sandbox}}).eval)
        pid = stop_server(cfg.device)
        err.print(f"stopped the server for {cfg.device} (pid {pid})" if pid else f"no server for {cfg.device} answered")
        return
    if spares < 1:
        fail(f"--spares must be at least 1 (got {spares})")
    if idle_minutes < 0:
        fail(f"--idle-minutes must be 0 or more (got {idle_minutes})")
    given = settings(config, {"eval": {"device": device, "sandbox": sandbox}})
    cfg = resolved(given.eval)
    try:
        server = EvalServer(cfg, spares=spares, idle_s=idle_minutes * 60 if idle_minutes else float("inf"))
    except OSError as exc:
        fail(str(exc))
    err.print(
        f"serving `kernelwright eval` for {cfg.device} ({spares} warm, sandbox {cfg.sandbox}) on {server.path}; "
        + (f"stops after {idle_minutes:g} idle minutes or " if idle_minutes else "stops at ")
        + "Ctrl-C",
        highlight=False,
        soft_wrap=True,
    )

    def job(j: dict) -> None:
        err.print(f"job: {j.get('candidate')} against {j.get('problem')}", highlight=False, soft_wrap=True)

    served = run_server(server, on_job=job)
    err.print(f"stopped after {served} evaluation(s)", highlight=False)


def register(app: typer.Typer) -> None:
    from kernelwright.cli.help import PlainCommand

    app.command("serve", cls=PlainCommand)(serve_cmd)
