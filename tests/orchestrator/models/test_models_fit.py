"""`orchestrator models cluster.toml`'s fits column: the placement `up` would take, from
the model's config and memory_gb for nodes not probed (no rank runs)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.models.catalog import ModelEntry, fits_cluster
from orchestrator.models.fit import fit
from testkit.config_files import memory_cluster as cluster
from testkit.model_configs import CONFIGS, SMOLLM2

FOUR_BIT = {"quantization": {"bits": 4, "group_size": 64}}


def published(name: str) -> dict[str, object]:
    return json.loads((CONFIGS / f"{name}.json").read_text()) | FOUR_BIT


def test_uneven_nodes_pipeline_with_the_full_context() -> None:
    """SmolLM2 (9 heads) on 2 GB + 1 GB: pipeline, both nodes' weights, its 8192 tokens."""
    result = fit(SMOLLM2, 270_000_000, cluster([2, 1]), {})
    assert result is not None and result.mode == "pipeline"
    assert len(result.weight_bytes) == 2 and result.max_context == 8192
    assert result.assumed == ("n0", "n1")
    assert result.text().startswith("pipeline, 0.")
    assert "context ≤ 8192 (n0, n1: not probed, memory_gb)" in result.text()


def test_qwen3_235b_on_three_studios_bounds_the_context() -> None:
    """4-bit Qwen3-235B-A22B (4 KV heads) on 3 x 44 GiB: its full 40960 tokens of KV do
    not fit beside the weights, a shorter context does (pipeline, about 45 GB a node)."""
    full = fit(published("Qwen3-235B-A22B"), 0, cluster([44, 44, 44]), {})
    assert full is not None and full.mode == "refused" and full.why.startswith("memory: ")
    assert full.max_context is not None and 10_000 < full.max_context < 40960
    shorter = cluster([44, 44, 44], model={"context_length": full.max_context})
    result = fit(published("Qwen3-235B-A22B"), 0, shorter, {})
    assert result is not None and result.mode == "pipeline", result
    assert all(40e9 < b < 50e9 for b in result.weight_bytes), result.weight_bytes
    assert f"context ≤ {full.max_context} " in full.text()


def test_refusals_name_the_check() -> None:
    """gpt-oss-120b on 3 nodes: heads do not divide and mlx-lm cannot pipeline it;
    Kimi-K2 on two 64 GB nodes: memory, at any context."""
    heads = fit(published("gpt-oss-120b"), 0, cluster([192, 192, 192]), {})
    assert heads is not None and heads.mode == "refused"
    assert heads.text().startswith("refused: architecture: ")
    memory = fit(published("Kimi-K2-Instruct"), 0, cluster([64, 64]), {})
    assert memory is not None and memory.mode == "refused" and memory.max_context == 0
    assert memory.text().startswith("refused: memory: ")


def test_unknown_memory_leaves_the_context_open() -> None:
    """No memory known: "unknown", no context bound, never a mode that "fits"."""
    result = fit(SMOLLM2, 270_000_000, cluster([None, None]), {})
    assert result is not None and result.mode == "unknown" and result.max_context is None
    assert result.text().startswith("unknown: the memory of n0, n1 is not known")
    assert "context" not in result.text()


def test_fits_cluster_reads_the_entry_directory(tmp_path: Path) -> None:
    """A model directory's config.json and safetensors size; no config: "?" (None)."""
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    entry = ModelEntry("m", "dir", path=str(tmp_path))
    assert str(fits_cluster(entry, cluster([2, 1]))).startswith("pipeline, ")
    assert fits_cluster(ModelEntry("m", "hub"), cluster([2, 1])) is None
