"""The run directory's layout: the names of its files, shared by the store that writes them and
the replay backend that reads them back. Standard library only."""

from __future__ import annotations

import re

ROUND_DIR = re.compile(r"^(\d{3,})_[0-9a-f]+$")  # NNN_<hash>/: one folder per round
RESPONSE_FILES = {"coder": "coder_response.md", "judge": "judge_response.md"}
PROMPT_FILES = {"coder": "coder_prompt.md", "judge": "judge_prompt.md"}
CANDIDATE = "candidate.py"
EVAL = "eval.json"
ROUND = "round.json"
PROFILE_DIR = "profile"
PROBLEM = "problem.py"
RUN_INFO = "run.json"
SUMMARY = "summary.json"
BEST = "best.py"
CANDIDATES_DIR = "candidates"  # NNN_<hash>/candidates/<i>_<hash>/: one folder per candidate when a round has several


def candidate_dir_name(index: int, basis: str) -> str:
    """The folder of candidate `index` of a round, named by its code (or its answer)."""
    import hashlib

    return f"{index}_{hashlib.sha256(basis.encode()).hexdigest()[:8]}"
