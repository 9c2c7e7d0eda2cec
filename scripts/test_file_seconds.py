"""Each test file's seconds, from a pytest log run with `--durations=0`, into tests/file_seconds.json.

    python3 -m pytest --durations=0 > /tmp/pytest.log; python3 scripts/test_file_seconds.py /tmp/pytest.log

tests/conftest.py hands the files to pytest-xdist's workers heaviest first (`--dist loadfile` gives
a file to one worker; a heavy file started last is a tail the other workers wait out). The figures
only order the run: a stale or missing one changes when a test runs, never what it checks.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/[^:\s]+\.py)")


def main() -> int:
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(sys.argv[1]).read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            seconds[Path(m.group(2)).name] += float(m.group(1))
    out = Path(__file__).resolve().parent.parent / "tests" / "file_seconds.json"
    data = {k: round(v) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= 1}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data)} files, {sum(data.values())} s in all -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
