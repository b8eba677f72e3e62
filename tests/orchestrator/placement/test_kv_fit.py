"""Preflight's and `plan`'s KV figures: how many full-context sequences each rank's budget
holds, refused only when not even one does, and the budgets handed to the ranks."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from contract.fingerprint import MemoryInfo, ModelInfo, NodeFingerprint, OsInfo, PythonInfo
from contract.model_config import config_info
from contract.placement import Placement
from contract.settings import RankSettings
from orchestrator.config import ClusterSpec
from orchestrator.config.load import check_cluster_data
from orchestrator.launch.plan import build_plan
from orchestrator.launch.plan_command import describe
from orchestrator.placement.decide import Refusal, place
from testkit.model_configs import CONFIGS

GIB = 1024**3
LLAMA = json.loads((CONFIGS / "Llama-3.3-70B-Instruct.json").read_text())
KV_PER_TOKEN = 80 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head_dim x 16 bits


def llama_on_one_mac(memory_gib: float, **serving: object) -> tuple[ClusterSpec, object]:
    """4-bit Llama-3.3-70B (40 GB), full context 131,072 tokens, on one node."""
    data = {"nodes": [{"name": "mac", "ip": "127.0.0.1"}],
            "preflight": {"reserve_memory_gb": 0}, "serving": serving}
    spec, _ = check_cluster_data(data, Path("test.toml"))
    memory = int(memory_gib * GIB)
    fingerprint = NodeFingerprint(
        hostname="h", os=OsInfo(system="Linux", name="Linux", version="1", kernel="1"),
        arch="arm64", memory=MemoryInfo(total_bytes=memory, available_bytes=memory),
        python=PythonInfo(version="3.12.0", executable="python3", implementation="CPython"),
        model=ModelInfo(spec="m", exists=True, kind="mlx_dir", weight_bytes=40 * 10**9,
                        config=config_info(LLAMA)),
    )
    return spec, place(spec, {"mac": fingerprint})


def test_plan_says_how_many_full_context_sequences_fit() -> None:
    """128 GiB less 40 GB of weights: 2 sequences of 131,072 tokens (43 GB each); fewer
    than max_batch_size 8, so the rest wait; the rank is told its budget."""
    spec, placement = llama_on_one_mac(128)
    assert isinstance(placement, Placement)
    share = placement.ranks[0]
    assert share.kv_budget_bytes == 128 * GIB - share.weight_bytes  # weights ~ 40 GB
    assert share.kv_sequences == share.kv_budget_bytes // (KV_PER_TOKEN * 131072) == 2
    text = describe(placement, 8)
    assert "2 full-context sequences of KV" in text
    assert ("KV budget 97.44 GB on rank 0: 2 full-context sequences of 131072 tokens fit; "
            "max_batch_size 8: the rest wait in the queue") in text
    settings = build_plan(spec, "t", placement=placement).ranks[0].files["settings.json"]
    decoded = msgspec.json.decode(settings, type=RankSettings)  # as the rank reads it
    assert decoded.kv_budget_bytes == [share.kv_budget_bytes]


def test_a_budget_below_one_full_sequence_is_refused_with_the_numbers() -> None:
    """kv_cache_gb = 10 cannot hold one 131,072-token sequence (43 GB): refused, naming
    both; 50 holds one, and a small max_batch_size x context is no reason to refuse."""
    _, refused = llama_on_one_mac(128, kv_cache_gb=10)
    assert isinstance(refused, Refusal) and refused.check == "memory"
    assert "kv_cache_gb = 10" in refused.found and "42.95 GB of KV" in refused.found
    assert "131072-token sequence" in refused.found
    _, placed = llama_on_one_mac(128, kv_cache_gb=50, max_batch_size=64)
    assert isinstance(placed, Placement) and placed.ranks[0].kv_sequences == 1
    spec, _ = llama_on_one_mac(128, kv_cache_gb=50)
    assert "kv_budget_bytes" not in build_plan(spec, "t", placement=placed).ranks[0].files[
        "settings.json"]  # kv_cache_gb itself travels in [serving]
