"""A model read at this machine without any node: a directory's config.json and weight
sizes, a GGUF's header, and what is said when it is not here."""

from __future__ import annotations

import json
from pathlib import Path

from contract.bundled_models import bundled_gguf_path
from contract.settings import ModelSettings
from orchestrator.models.model_read import read_model
from testkit.model_configs import SMOLLM2


def test_a_directory_here_gives_its_config_and_weight_bytes(tmp_path: Path) -> None:
    """Two shards' sizes add up (the index's total wins when there is one)."""
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 300)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 200)
    read = read_model(ModelSettings(path=str(tmp_path)))
    assert read.info is not None and read.info.weight_bytes == 500
    assert read.info.config is not None and read.info.config.num_hidden_layers == 30
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 12345}, "weight_map": {}}))
    indexed = read_model(ModelSettings(path=str(tmp_path))).info
    assert indexed is not None and indexed.weight_bytes == 12345


def test_a_directory_only_on_the_nodes_is_not_readable_here(tmp_path: Path) -> None:
    """No config.json here: no info, and the reason names the path."""
    read = read_model(ModelSettings(path=str(tmp_path / "elsewhere")))
    assert read.info is None and "is not a model directory at this machine" in read.source
    (tmp_path / "config.json").write_text("{not json")
    broken = read_model(ModelSettings(path=str(tmp_path)))
    assert broken.info is None and "config.json cannot be read" in broken.source


def test_a_gguf_file_and_the_bundled_model_are_read_from_their_header() -> None:
    """bundled: and a .gguf path: the header's shape (SmolLM2's 30 layers)."""
    for path in ("bundled:smollm2-135m-instruct", str(bundled_gguf_path("smollm2-135m-instruct"))):
        read = read_model(ModelSettings(path=path))
        assert read.info is not None and read.info.config is not None, read.source
        assert read.info.config.num_hidden_layers == 30
