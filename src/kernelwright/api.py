"""kernelwright from Python (a notebook, a script): what `kernelwright eval` and `optimize` do,
as functions that return records instead of printing them.

    import kernelwright as kw

    result = kw.evaluate("problem.py", "candidate.py", kw.EvalConfig(device="cpu"))
    result.status, result.speedup            # an EvalResult: the typed record `eval --json` prints

    summary = kw.optimize("problem.py", coder="openai:gpt-5", rounds=5)
    summary["best"], summary["run_dir"]      # the run's summary.json, and where its files are

    with kw.open_store() as db:              # every run of this user (the store `kernelwright runs` lists)
        db.runs()

Bad input raises the exception the command line turns into its one-line error (ValueError,
`kernelwright.engine.EngineError`, `kernelwright.models.ModelSetupError`, ...); nothing here exits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelwright.core.config import EvalConfig, Settings
from kernelwright.core.record import EvalResult


def evaluate(
    problem: str | Path,
    candidate: str | Path | None = None,
    config: EvalConfig | None = None,
    *,
    code: str | None = None,
    **options: Any,
) -> EvalResult:
    """Build, check and time a candidate (a file, or its source as `code`) against `problem` in an
    isolated child process, as `kernelwright eval` does. `options` override fields of `config`
    (`device="cpu"`, `trials=3`, ...)."""
    from kernelwright import engine

    if (candidate is None) == (code is None):
        raise ValueError("pass the candidate as a file or as code=, one of the two")
    from kernelwright.engine.config_resolution import resolve_config

    config = resolve_config(dataclasses.replace(config or EvalConfig(), **options))
    return engine.evaluate(problem, candidate, config, candidate_text=code)


def optimize(
    problem: str | Path,
    coder: str,
    judge: str | None = None,
    *,
    rounds: int | None = None,
    device: str | None = None,
    backend: str | None = None,
    out: str | Path | None = None,
    store: str | Path | None = None,
    name: str | None = None,
    resume: str | Path | None = None,
    settings: Settings | None = None,
    on_progress: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run the forge loop on `problem` as `kernelwright optimize` does (its run directory, its row
    in the store), and return the run's summary (summary.json) with `run_dir` added.

    `coder`/`judge`: openai:MODEL, anthropic:MODEL, litellm:MODEL, replay:RUN_DIR, ...; `settings`
    (default: the settings file found from the current directory) holds everything else; the
    arguments given here override it. `on_progress` receives each `loop.records.Progress`.
    """
    from kernelwright.core.settings_file import load_settings
    from kernelwright.engine.config_resolution import resolve_config
    from kernelwright.loop.forge import Forge, engine_evaluator
    from kernelwright.models import resolve_model
    from kernelwright.models.backend_spec import resolve_coders
    from kernelwright.store.db import Store
    from kernelwright.store.queries import default_store
    from kernelwright.store.recorder import IndexingRecorder
    from kernelwright.store.rundir import RunDir, default_run_dir, problem_name, read_summary

    problem = Path(problem)
    if not problem.is_file():
        raise FileNotFoundError(f"problem file not found: {problem}")
    given: dict[str, dict[str, Any]] = {
        "loop": {k: v for k, v in (("rounds", rounds), ("backend", backend)) if v is not None},
        "eval": {"device": device} if device else {},
        "model": {"coder": coder} | ({"judge": judge} if judge else {}),
    }
    if settings is None:
        settings = load_settings(None, {k: v for k, v in given.items() if v})
    else:
        settings = dataclasses.replace(
            settings,
            eval=dataclasses.replace(settings.eval),
            explicit=set(settings.explicit),
            loop=dataclasses.replace(settings.loop, model=dataclasses.replace(settings.loop.model)),
        )
        for section, values in given.items():
            target = settings.loop.model if section == "model" else getattr(settings, section)
            for key, value in values.items():
                setattr(target, key, value)
                settings.explicit.add(f"{section if section != 'model' else 'loop.model'}.{key}")
        settings.validate()
    cfg, eval_cfg, model_cfg = settings.loop, settings.eval, settings.loop.model
    eval_cfg.profile.enabled = cfg.profile
    eval_cfg = resolve_config(eval_cfg)
    if not settings.given("loop.backend"):
        cfg.backend = "cpp" if eval_cfg.device == "cpu" else "cuda"
    if model_cfg.prompt_dir:
        from kernelwright.models.prompts import check_prompt_dir

        check_prompt_dir(model_cfg.prompt_dir)
    coders = resolve_coders(coder, model_cfg, cfg.candidates)
    judge_model = resolve_model(model_cfg.judge or coder, "judge", model_cfg)
    done: list = []
    if resume is not None:
        run_dir, done = RunDir.reopen(resume)
    else:
        run_dir = RunDir(
            Path(out) if out else default_run_dir(problem, name=name),
            problem,
            {
                "name": name or problem_name(problem),
                "coder": coders[0].name,
                "judge": judge_model.name,
                "backend": cfg.backend,
                "device": eval_cfg.device,
                "round_limit": cfg.rounds,
                "trials": eval_cfg.trials,
                "atol": eval_cfg.atol,
                "rtol": eval_cfg.rtol,
                "verdict": eval_cfg.verdict,
                "seed": eval_cfg.seed,
                "settings_file": settings.source,
                "candidates": cfg.candidates,
                "coders": [m.name for m in coders],
                "executor": "serial",
                "api": True,
            },
        )
    recorder = IndexingRecorder(run_dir, Store.open(store or default_store()), kind="optimize")
    forge = Forge(
        problem,
        coders[0],
        judge_model,
        engine_evaluator(eval_cfg),
        cfg,
        device=eval_cfg.device,
        recorder=recorder,
        coders=coders,
        on_progress=on_progress,
    )
    if done:
        forge.restore(done, wall_s=float(read_summary(run_dir.path).get("wall_s") or 0.0))
    state = forge.run()
    return recorder.write_summary(state, final=True) | {"run_dir": str(run_dir.path)}
