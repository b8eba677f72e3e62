"""A model's config.json is read with every number bounded: real configs pass, a hostile
or damaged one is refused naming the file and the field, before placement loops on it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from contract.model_config import ModelConfigError, config_info
from node_agent.probes.model import inspect_model_dir

CONFIGS = Path(__file__).parents[1] / "fixtures" / "model_configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_published_configs_are_within_bounds(path: Path) -> None:
    """Every published config the tests carry reads without an error."""
    assert config_info(json.loads(path.read_text()), str(path)).num_hidden_layers


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 10**12), ("hidden_size", -4), ("vocab_size", 0),
     ("num_attention_heads", 1 << 40), ("num_experts", 10**9),
     ("full_attention_interval", 10**9)],
)
def test_out_of_range_numbers_are_refused_naming_file_and_field(field: str, value: int) -> None:
    """A number no real model has: ModelConfigError naming the file, the field and the range."""
    config = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    config[field] = value
    with pytest.raises(ModelConfigError, match=rf"^models/x/config.json: {field} = {value} is "):
        config_info(config, "models/x/config.json")


def test_a_huge_layer_count_with_an_interval_fails_at_once() -> None:
    """Qwen3-Next's interval expands to one entry per layer: a huge count is refused, not
    looped over."""
    started = time.monotonic()
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        config_info({"num_hidden_layers": 10**11, "full_attention_interval": 4})
    assert time.monotonic() - started < 1.0


def test_the_probe_reports_the_file_and_field(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A node's model probe gives the operator the file and the field, no traceback."""
    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["num_key_value_heads"] = 10**15
    (model / "config.json").write_text(json.dumps(config))
    info = inspect_model_dir(str(model), model)
    assert info.error is not None
    assert str(model / "config.json") in info.error and "num_key_value_heads" in info.error
