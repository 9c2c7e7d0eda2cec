"""benchmarks/first_call_draws.py's summary: each way's draws against the plain draws' median, a
draw over 5% slower counted as slow, failed draws counted apart (never as a figure)."""

from __future__ import annotations

import json

from benchmarks import first_call_draws


def test_slow_draws_are_counted_against_the_plain_draws_median(tmp_path):
    rows = [
        *({"pair": "level1/77_x", "way": "plain", "ms": ms} for ms in (1.30, 1.31, 1.32)),
        *({"pair": "level1/77_x", "way": "kw:default", "ms": ms} for ms in (1.42, 1.31, 1.42)),
        {"pair": "level1/77_x", "way": "kw:no_guards", "error": "timed out after 300 s"},
        {"pair": "level1/77_x", "way": "kw:no_guards", "ms": 1.36},
        {"pair": "level1/60_y", "way": "kw:default", "ms": 3.69},  # no plain draw: nothing to count against
    ]
    (tmp_path / "draws.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = first_call_draws.summary(tmp_path)
    assert got["level1/77_x"]["plain"]["slow"] == 0
    assert got["level1/77_x"]["kw:default"] == {"ms": [1.42, 1.31, 1.42], "median": 1.42, "slow": 2}
    assert got["level1/77_x"]["kw:no_guards"]["slow"] == 0  # 1.36 is within 5% of 1.31
    assert got["level1/60_y"]["kw:default"]["slow"] == 0
    md = (tmp_path / "draws.md").read_text()
    assert "| level1/77_x | kw:default | 1.42, 1.31, 1.42 | 1.42 | 2 of 3 | 0 |" in md
    assert "| level1/77_x | kw:no_guards | 1.36 | 1.36 | 0 of 1 | 1 |" in md
    assert "| level1/60_y | kw:default | 3.69 | 3.69 | - | 0 |" in md


def test_every_variant_turns_something_off_and_an_unknown_way_is_refused(tmp_path):
    assert first_call_draws.VARIANTS["default"] == ("", [])
    assert all(text or opts for name, (text, opts) in first_call_draws.VARIANTS.items() if name != "default")
    try:
        first_call_draws.run(tmp_path, ["level1/1_x"], ["kw:nonsense"], 1, "cpu", tmp_path / "out", 10.0)
    except SystemExit as exc:
        assert "unknown way 'kw:nonsense'" in str(exc)
    else:
        raise AssertionError("an unknown way ran")
