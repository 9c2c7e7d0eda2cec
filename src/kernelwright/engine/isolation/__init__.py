"""Isolation of the engine's children: what a child may see and do, and what is left when one dies.

- `sandbox`: where a child runs: bubblewrap (a private mount namespace, read-only system) or a plain
  process (`wrap`); `resolve` turns "auto" into one of them, called at the entry points through
  `engine/config_resolution.py`.
- `containment`: what holds in every mode: resource limits, a PID namespace, a cgroup where one can be
  made, a marker sweep of everything the child started (`prepare`, `annotate`).
- `environment`: the child's environment: an allow-list of the caller's, minus secrets (`child_env`).
- `leftovers`: the working directories of evaluators that died, found and removed (`make_dir`, `sweep`).
"""

from kernelwright.engine.isolation import containment, environment, leftovers, sandbox

__all__ = ["containment", "environment", "leftovers", "sandbox"]
