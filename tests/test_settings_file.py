"""The settings file (kernelwright.toml / [tool.kernelwright]) read into the one typed configuration:
defaults < file < command line; unknown keys and wrong types are one line naming key and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelwright.core.config import EvalConfig, LoopConfig
from kernelwright.core.settings_file import SettingsError, find_settings_file, load_settings
from kernelwright.models.chat import Usage
from kernelwright.models.pricing import PriceTable

TEAM = """
[model]
coder = "openai:gpt-5"
judge = "anthropic:claude-sonnet-4-5"
base_url = "http://gpu-box:8000/v1"
price_file = "prices.toml"

[model.retry]
max_attempts = 3
base_delay_s = 0.5

[model.prices]
"qwen2.5-coder:32b" = {input = 0.1, output = 0.2}

[loop]
rounds = 6
max_cost_usd = 5
target_speedup = 2.0

[eval]
atol = 1e-2
rtol = 1e-2
verdict = "strict"
guards.fail_on = ["mutates_inputs"]

[eval.timeouts]
build = 900
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_file_sets_the_typed_configuration_and_the_command_line_overrides_it(tmp_path):
    f = write(tmp_path / "kernelwright.toml", TEAM)
    s = load_settings(f, {"eval": {"rtol": 0.5}, "loop": {"rounds": 2}})
    assert s.source == str(f)
    assert (s.eval.atol, s.eval.rtol, s.eval.verdict, s.eval.timeouts.build) == (0.01, 0.5, "strict", 900.0)
    assert s.eval.guards.fail_on == ("mutates_inputs",) and s.eval.trials == EvalConfig().trials  # untouched: default
    assert (s.loop.rounds, s.loop.max_cost_usd, s.loop.target_speedup) == (2, 5.0, 2.0)
    assert s.loop.min_improvement == LoopConfig().min_improvement
    m = s.loop.model
    assert (m.coder, m.judge, m.base_url) == ("openai:gpt-5", "anthropic:claude-sonnet-4-5", "http://gpu-box:8000/v1")
    assert (m.retry.max_attempts, m.retry.base_delay_s) == (3, 0.5)
    assert m.price_file == str(tmp_path / "prices.toml")  # relative to the file, not to the current directory
    assert s.given("loop.rounds") and s.given("eval.atol") and not s.given("loop.backend")
    table = PriceTable.load(None, m.prices)
    assert table.cost("qwen2.5-coder:32b", Usage(1_000_000, 1_000_000)) == pytest.approx(0.3)


def test_without_a_file_the_defaults_hold(tmp_path):
    s = load_settings(None, None, start=tmp_path, search=False)
    assert s.source is None and s.eval == EvalConfig(cache_dir=s.eval.cache_dir) and s.loop == LoopConfig()


@pytest.mark.parametrize(
    "text, message",
    [
        ("[eval]\natoll = 1\n", "unknown key 'eval.atoll'; known keys in [eval]: device, trials, atol"),
        ("[evaluation]\natol = 1\n", "unknown section [evaluation]; known: [eval], [loop], [model]"),
        (
            "[eval.timeouts]\nbild = 1\n",
            "unknown key 'eval.timeouts.bild'; known keys in [eval.timeouts]: startup, build",
        ),
        ("[model.retry]\nmax_attempt = 1\n", "unknown key 'model.retry.max_attempt'"),
        ('[eval]\ntrials = "five"\n', "'eval.trials' must be int (got 'five')"),
        ('[eval]\ndevice = "tpu"\n', "'eval.device' must be auto, cuda or cpu (got 'tpu')"),
        ("[loop]\nrounds = 0\n", "--rounds must be at least 1 (got 0) (settings from"),
        ("[model.prices]\nm = {input = 1}\n", "'model.prices.m' must be {input = USD/Mtok, output = USD/Mtok}"),
        ("[eval\natol = 1\n", "is not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_key_and_the_file(tmp_path, text, message):
    f = write(tmp_path / "kernelwright.toml", text)
    with pytest.raises(SettingsError) as exc:
        load_settings(f)
    assert message in str(exc.value) and str(f) in str(exc.value) and "\n" not in str(exc.value)


def test_the_nearest_file_is_found_and_kernelwright_toml_wins_over_pyproject(tmp_path):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_settings_file(deep) is None or not str(find_settings_file(deep)).startswith(str(tmp_path))
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.kernelwright]: not a settings file
    assert find_settings_file(deep) is None or not str(find_settings_file(deep)).startswith(str(tmp_path))
    py = write(tmp_path / "a" / "pyproject.toml", "[tool.kernelwright.loop]\nrounds = 3\n")
    assert find_settings_file(deep) == py
    assert load_settings(start=deep).loop.rounds == 3
    own = write(tmp_path / "a" / "kernelwright.toml", "[loop]\nrounds = 4\n")
    assert find_settings_file(deep) == own and load_settings(start=deep).loop.rounds == 4


def test_a_pyproject_given_with_config_must_hold_the_table(tmp_path):
    f = write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    with pytest.raises(SettingsError, match=r"has no \[tool.kernelwright\] table"):
        load_settings(f)
    with pytest.raises(SettingsError, match="settings file not found"):
        load_settings(tmp_path / "nope.toml")
