"""contract/settings.py: the one settings type of a rank, its checks and its JSON file."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from contract.settings import (
    ModelSettings,
    RankSettings,
    ServingSettings,
    SettingsError,
    dump_settings,
    encode_settings,
    load_settings,
    settings_problems,
)


def test_settings_round_trip(tmp_path: Path) -> None:
    """dump_settings then load_settings gives the same settings."""
    settings = RankSettings(
        model=ModelSettings(path="bundled:smollm2-135m-instruct"),
        serving=ServingSettings(rank_api_port=9000),
    )
    dump_settings(settings, tmp_path / "s.json")
    assert load_settings(tmp_path / "s.json") == settings


@pytest.mark.parametrize(
    "content",
    [
        '{"model": {"path": ""}}',
        '{"model": {"path": "m"}, "serving": {"max_batch_size": 0}}',
        '{"model": {"path": "m"}, "bogus": 1}',
        '{"model": {"path": "m"}, "serving": {"max_tokens_default": 9, "max_tokens_limit": 4}}',
        "not json",
    ],
)
def test_invalid_settings_file_is_rejected(tmp_path: Path, content: str) -> None:
    """Invalid values, unknown fields and malformed JSON raise SettingsError."""
    (tmp_path / "s.json").write_text(content)
    with pytest.raises(SettingsError):
        load_settings(tmp_path / "s.json")


def test_the_error_names_the_file_and_the_field(tmp_path: Path) -> None:
    """A bad or unreadable settings file is named, with the field at fault."""
    path = tmp_path / "s.json"
    path.write_text('{"model": {"path": "m"}, "serving": {"max_batch_size": 0}}')
    with pytest.raises(SettingsError) as excinfo:
        load_settings(path)
    assert str(path) in str(excinfo.value)
    assert "max_batch_size" in str(excinfo.value)
    with pytest.raises(SettingsError, match="cannot read settings file"):
        load_settings(tmp_path / "missing.json")


def test_every_cross_field_problem_is_reported_at_once_with_its_path() -> None:
    """Construction checks the rules the types cannot state, all of them, by field path."""
    with pytest.raises(SettingsError) as excinfo:
        RankSettings(
            model=ModelSettings(path=" ", id=""),
            serving=ServingSettings(max_tokens_default=9, max_tokens_limit=4),
        )
    assert str(excinfo.value) == (
        "model.path: is empty; model.id: is empty; "
        "serving.max_tokens_default: 9 is above max_tokens_limit 4"
    )


def test_each_problem_carries_a_fix() -> None:
    """A cross-field problem tells how to fix it; valid settings have none."""
    problems = settings_problems(
        ModelSettings(path="m"), ServingSettings(max_tokens_default=9, max_tokens_limit=4)
    )
    assert [(p.path, p.fix) for p in problems] == [
        ("serving.max_tokens_default", "lower it or raise max_tokens_limit")
    ]
    assert settings_problems(ModelSettings(path="m"), ServingSettings()) == []


def test_unknown_keys_are_errors_in_every_table() -> None:
    """A typo never passes silently: [model] and [serving] forbid unknown keys too."""
    for data in ({"model": {"path": "m", "pth": 1}}, {"model": {"path": "m"}, "serving": {"x": 1}}):
        with pytest.raises(msgspec.ValidationError, match="unknown field"):
            msgspec.convert(data, type=RankSettings)


@pytest.mark.parametrize(
    ("model", "served"),
    [
        (ModelSettings(path="bundled:smollm2-135m-instruct"), "smollm2-135m-instruct"),
        (ModelSettings(path="/models/Qwen3-30B-A3B-4bit/"), "Qwen3-30B-A3B-4bit"),
        (ModelSettings(path="/models/x", id="my-model"), "my-model"),
    ],
)
def test_served_id_is_the_id_or_the_paths_last_component(model: ModelSettings, served: str) -> None:
    """Clients ask for the id, else the model's directory or bundled name."""
    assert model.served_id == served


def test_the_file_holds_only_what_differs_from_the_defaults() -> None:
    """omit_defaults: a rank reading an older or newer file takes its own defaults."""
    settings = RankSettings(model=ModelSettings(path="m"), serving=ServingSettings(queue_limit=3))
    assert json.loads(encode_settings(settings)) == {
        "model": {"path": "m"},
        "serving": {"queue_limit": 3},
    }
