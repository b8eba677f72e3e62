"""Tensor or pipeline, from the model's config and each node's memory (fingerprints
made here: the numbers, not a machine, are under test)."""

from __future__ import annotations

import json
from pathlib import Path

from contract.fingerprint import MemoryInfo, ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from contract.model_config import config_info
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.placement.decide import Refusal, place
from testkit.model_configs import CONFIGS, SMOLLM2

GIB = 1024**3


def spec(nodes: int, memory_gb: list[float] | None = None, **cluster: str) -> ClusterSpec:
    data = {
        "cluster": cluster,
        "nodes": [
            {"name": f"n{i}", "ip": "127.0.0.1"}
            | ({"memory_gb": memory_gb[i]} if memory_gb else {})
            for i in range(nodes)
        ],
        "preflight": {"reserve_memory_gb": 0},
    }
    result, _warnings = check_cluster_data(data, Path("test.toml"))
    return result


def fingerprint(config: dict[str, object], weight_bytes: int, memory_gib: float,
                system: str = "Linux") -> NodeFingerprint:
    memory = int(memory_gib * GIB)
    return NodeFingerprint(
        hostname="h",
        os=OsInfo(system=system, name=system, version="1", kernel="1"),
        arch="arm64",
        memory=MemoryInfo(total_bytes=memory, available_bytes=memory),
        python=PythonInfo(version="3.12.0", executable="python3", implementation="CPython"),
        model=ModelInfo(spec="m", exists=True, kind="mlx_dir", weight_bytes=weight_bytes,
                        config=config_info(config)),
    )


def prints(cluster: ClusterSpec, *fps: NodeFingerprint) -> dict[str, NodeFingerprint]:
    return {node.name: fp for node, fp in zip(cluster.nodes, fps, strict=True)}


def test_auto_takes_tensor_when_heads_divide_and_shares_fit() -> None:
    cluster = spec(3)
    result = place(cluster, prints(cluster, *[fingerprint(SMOLLM2, 270_000_000, 16)] * 3))
    assert isinstance(result, Placement) and result.mode == "tensor"
    assert result.pipeline_split is None


def test_auto_takes_pipeline_when_heads_do_not_divide() -> None:
    """9 heads on 2 ranks: pipeline, with the reason and each rank's layer range."""
    cluster = spec(2)
    result = place(cluster, prints(cluster, *[fingerprint(SMOLLM2, 270_000_000, 16)] * 2))
    assert isinstance(result, Placement) and result.mode == "pipeline"
    assert "9 attention heads and 3 KV heads do not divide by 2" in result.reason
    assert [share.layers for share in result.ranks] == [(15, 30), (0, 15)]
    assert result.pipeline_split == [15, 15]


def test_memory_gb_weighs_the_split() -> None:
    """memory_gb 2 : 1 : 1 puts about half the layers on the first node."""
    cluster = spec(3, memory_gb=[2, 1, 1], parallel="pipeline")
    result = place(cluster, prints(cluster, *[fingerprint(SMOLLM2, 270_000_000, 16)] * 3))
    assert isinstance(result, Placement) and result.pipeline_split is not None
    assert 14 <= result.pipeline_split[0] <= 16
    assert result.ranks[0].budget_bytes == 2 * GIB


def test_uneven_macs_hold_what_equal_shares_cannot() -> None:
    """Qwen3-30B-A3B 4-bit (17 GB) on a 64 GB and an 8 GB Mac: equal tensor shares do not
    fit the small one, so auto pipelines with more layers on the large one."""
    config = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    config["max_position_embeddings"] = 8192
    weights = 17_200_000_000
    cluster = spec(2)
    big, small = (fingerprint(config, weights, memory, "Darwin") for memory in (64, 8))
    result = place(cluster, prints(cluster, big, small))
    assert isinstance(result, Placement) and result.mode == "pipeline"
    assert "equal shares do not fit n1" in result.reason
    assert result.pipeline_split and result.pipeline_split[0] > 3 * result.pipeline_split[1]


def test_tensor_forced_with_heads_that_do_not_divide_is_refused() -> None:
    cluster = spec(2, parallel="tensor")
    result = place(cluster, prints(cluster, *[fingerprint(SMOLLM2, 270_000_000, 16)] * 2))
    assert isinstance(result, Refusal) and result.check == "heads"
    assert 'parallel = "auto" or "pipeline"' in result.fix and "1 or 3" in result.fix


def test_architecture_without_pipeline_support_is_refused_by_name() -> None:
    """gpt-oss's 64 heads / 8 KV heads do not divide by 3, and mlx-lm cannot pipeline it."""
    config = json.loads((CONFIGS / "gpt-oss-120b.json").read_text())
    cluster = spec(3)
    result = place(cluster, prints(cluster, *[fingerprint(config, 65 * 10**9, 128)] * 3))
    assert isinstance(result, Refusal) and result.check == "architecture"
    assert "'gpt_oss'" in result.found and "qwen3_moe" in result.fix and "1 or 2 or 4 or 8" \
        in result.fix


def test_a_model_too_large_for_the_cluster_is_refused_with_figures() -> None:
    """Qwen3-235B 4-bit (132 GB) on two 64 GB Macs: no mode fits; the figures and a
    smaller quantization are named."""
    config = json.loads((CONFIGS / "Qwen3-235B-A22B.json").read_text())
    config["quantization"] = {"bits": 8, "group_size": 64}
    cluster = spec(2)
    result = place(cluster, prints(cluster, *[fingerprint(config, 250 * 10**9, 64, "Darwin")] * 2))
    assert isinstance(result, Refusal) and result.check == "memory"
    assert "in pipeline mode" in result.found and "may use" in result.found
    assert "4-bit quantization" in result.fix


def test_more_pipeline_ranks_than_layers_is_refused() -> None:
    """9 heads on 4 ranks do not divide, and a 3-layer model cannot give 4 stages a layer
    each: a refusal naming both, not an error from the split."""
    cluster = spec(4)
    three_layers = SMOLLM2 | {"num_hidden_layers": 3}
    result = place(cluster, prints(cluster, *[fingerprint(three_layers, 30_000_000, 16)] * 4))
    assert isinstance(result, Refusal) and result.check == "layers"
    assert "3 layers cannot give each of 4 pipeline ranks one" in result.found
    assert "at most 3 nodes" in result.fix
