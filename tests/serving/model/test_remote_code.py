"""A model directory that asks to run its own code: refused unless [model]
trust_remote_code, on every load path (plain, tensor-sharded, draft)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from contract.settings import ModelSettings, RankSettings
from serving.model.loading import ModelLoadError, load, tokenizer_options
from serving.model.remote_code import code_requests
from testkit.remote_code_model import CODE_FILE, with_tokenizer_code


def _settings(path: Path, trust: bool = False) -> RankSettings:
    return RankSettings(model=ModelSettings(path=str(path), trust_remote_code=trust))


def test_tokenizer_code_refused_without_the_setting(tmp_path: Path, tiny_model_dir: Path) -> None:
    """At 1 rank the load is refused naming trust_remote_code and the file; nothing ran."""
    marker = tmp_path / "ran"
    model = with_tokenizer_code(tiny_model_dir, tmp_path / "model", marker)
    with pytest.raises(ModelLoadError) as caught:
        load(_settings(model), mx.distributed.init())
    message = str(caught.value)
    assert "trust_remote_code = true" in message
    assert str(model / "tokenizer_config.json") in message and CODE_FILE in message
    assert not marker.exists()


def test_sharded_load_is_told_not_to_trust(tmp_path: Path, tiny_model_dir: Path) -> None:
    """mlx-lm's sharded_load, as the tensor-parallel path calls it, runs no tokenizer code
    (left to itself it trusts the repository)."""
    from mlx_lm.utils import sharded_load

    marker = tmp_path / "ran"
    model = with_tokenizer_code(tiny_model_dir, tmp_path / "model", marker)
    with pytest.raises(ValueError, match="trust_remote_code"):
        sharded_load(str(model), tokenizer_config=tokenizer_options(False))
    assert not marker.exists()


def test_trusted_model_runs_its_code(tmp_path: Path, tiny_model_dir: Path) -> None:
    """With [model] trust_remote_code = true the same directory loads, its code run."""
    marker = tmp_path / "ran"
    model = with_tokenizer_code(tiny_model_dir, tmp_path / "model", marker)
    assert code_requests(model)
    load(_settings(model, trust=True), mx.distributed.init())
    assert marker.read_text() == "ran"
