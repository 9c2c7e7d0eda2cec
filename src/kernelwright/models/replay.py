"""Replay: a recorded run's responses played back in order, without any API.

A run directory holds one folder per round, `NNN_<hash>/`, with the Coder's raw answer in
`coder_response.md` and the Judge's in `judge_response.md` (when the Judge was asked). The
replay Coder answers its n-th call with the n-th recorded Coder answer, the replay Judge
likewise; the prompts it is given are not compared, so a replay on another GPU re-evaluates
the same code even where the verdicts differ.
"""

from __future__ import annotations

from pathlib import Path

from kernelwright.core.run_files import RESPONSE_FILES, ROUND_DIR
from kernelwright.models.chat import AnswersExhausted, Attempt, Completion, Message, ModelSetupError, Usage


def round_dirs(run_dir: Path) -> list[Path]:
    """The round folders of a run directory, in round order."""
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := ROUND_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


class ReplayChat:
    def __init__(self, run_dir: str | Path, role: str):
        self.run_dir = Path(run_dir)
        self.role = role
        self.name = f"replay:{self.run_dir}"
        if role not in RESPONSE_FILES:
            raise ModelSetupError(f"replay knows the roles {', '.join(RESPONSE_FILES)}, not {role!r}")
        if not self.run_dir.is_dir():
            raise ModelSetupError(
                f"replay run directory not found: {self.run_dir}; pass a directory written by `kernelwright optimize`"
            )
        name = RESPONSE_FILES[role]
        self.responses = [d / name for d in round_dirs(self.run_dir) if (d / name).is_file()]
        if role == "coder" and not self.responses:
            raise ModelSetupError(
                f"{self.run_dir} holds no recorded {role} responses (NNN_<hash>/{name}); pass a run directory"
            )
        self.played = 0

    def skip(self, n: int) -> None:
        """Move past `n` answers (those a resumed run's recorded rounds already used)."""
        self.played += n

    def complete(self, messages: list[Message]) -> Completion:
        if self.played >= len(self.responses):
            raise AnswersExhausted(f"replay of {self.run_dir} has no more {self.role} responses ({self.played} played)")
        path = self.responses[self.played]
        self.played += 1
        return Completion(
            text=path.read_text(),
            usage=Usage(),
            model=f"replay:{path.parent.name}",
            attempts=[Attempt(attempt=1, ok=True)],
            cost_usd=0.0,
            finish_reason="replay",
        )
