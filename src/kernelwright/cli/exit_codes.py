"""What `kernelwright`'s exit status tells a script. The one place these numbers are defined.

  0  the command ran: `eval` evaluated the candidate (whatever the verdict, which is in the
     output); `optimize` finished (round limit, target, budget, or a replay's end) with at
     least one model answer
  1  the run stopped on an error: no model answer at all (an endpoint never reached, a key
     refused), a model that failed for good mid-run, the engine unable to go on; the summary
     says `stopped` and why
  2  bad input, or the tool could not run: a missing or wrong file, an unknown option value,
     a bad settings file, no GPU for --device cuda (one line on stderr names the fix)
3  `eval --fail-on VERDICTS`: the candidate was evaluated and its verdict is one of VERDICTS
     (for CI: `--fail-on incorrect,compile_error,runtime_error`)
130  interrupted (Ctrl-C); what ran so far is kept
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    STOPPED = 1
    BAD_INPUT = 2
    VERDICT = 3
    INTERRUPTED = 130
