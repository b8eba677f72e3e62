"""The popular-models table of docs/placement.md, from the code's own decision
(orchestrator/placement/decide.py) on the published configs in
tests/fixtures/model_configs/, so the table cannot drift from what `up` does.

    python scripts/placement_table.py      print the table (markdown)

tests/orchestrator/placement/test_docs_table.py checks that the page holds this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.fingerprint import (  # noqa: E402
    METAL_DEFAULT_WIRED_SHARE,
    MemoryInfo,
    ModelInfo,
    NodeFingerprint,
    OsInfo,
    PythonInfo,
)
from contract.model_config import config_info  # noqa: E402
from orchestrator.config.load import check_cluster_data  # noqa: E402
from orchestrator.placement.decide import Refusal, place  # noqa: E402
from orchestrator.placement.model_size import kv_bytes, model_shape  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
MODELS = ["Qwen3-30B-A3B", "Qwen3-32B", "Llama-3.3-70B-Instruct", "gpt-oss-120b",
          "GLM-4.5-Air", "Qwen3-235B-A22B", "GLM-4.5", "DeepSeek-V3", "Kimi-K2-Instruct"]
MACS = {  # column: each Mac's RAM in GB
    "2 x 192 GB": [192, 192],
    "3 x 192 GB": [192, 192, 192],
    "4 x 192 GB": [192, 192, 192, 192],
    "3 x 96 GB": [96, 96, 96],
    "3 x 256 GB": [256, 256, 256],
    "128 + 64 GB": [128, 64],
    "512 + 192 + 96 GB": [512, 192, 96],
}
CONTEXT = 32768
FOUR_BIT = {"quantization": {"bits": 4, "group_size": 64}}
GB = 1e9


def table() -> str:
    head = ["model", "heads / KV", "4-bit weights", "KV per token", *MACS]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in MODELS:
        config = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8")) | FOUR_BIT
        info = config_info(config)
        shape = model_shape(info)
        weights = shape.total_params * (4 / 8 + 4 / 64)
        kv = kv_bytes(info, range(len(shape.layer_params)), 1)
        cells = [name, f"{info.num_attention_heads} / {info.num_key_value_heads}",
                 f"{weights / GB:.0f} GB", f"{kv / 1024:.0f} KiB"]
        cells += [_cell(config, ram) for ram in MACS.values()]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _cell(config: dict[str, object], ram_gb: list[int]) -> str:
    nodes = [{"name": f"mac{i}", "ip": f"10.0.0.{i + 1}"} for i in range(len(ram_gb))]
    spec, _warnings = check_cluster_data(
        {"nodes": nodes, "model": {"context_length": CONTEXT}}, Path("table.toml"))
    model = ModelInfo(spec="m", exists=True, kind="mlx_dir", config=config_info(config))
    prints = {node["name"]: _mac(ram, model) for node, ram in zip(nodes, ram_gb, strict=True)}
    decided = place(spec, prints)
    if decided is None:
        return "?"
    if isinstance(decided, Refusal):
        return f"refused ({decided.check})"
    shares = " · ".join(f"{share.weight_bytes / GB:.0f}" for share in decided.ranks)
    return f"tensor, {shares.split(' · ')[0]} GB each" if decided.mode == "tensor" \
        else f"pipeline, {shares} GB"


def _mac(ram_gb: int, model: ModelInfo) -> NodeFingerprint:
    """A Mac of this RAM with macOS's default GPU limit (no iogpu.wired_limit_mb)."""
    ram = ram_gb * 10**9
    return NodeFingerprint(
        hostname="mac",
        os=OsInfo(system="Darwin", name="macOS", version="15", kernel="24"),
        arch="arm64",
        memory=MemoryInfo(total_bytes=ram, available_bytes=ram),
        python=PythonInfo(version="3.12.0", executable="python3", implementation="CPython"),
        model=model,
    )


if __name__ == "__main__":
    print(f"(default GPU limit: {METAL_DEFAULT_WIRED_SHARE:.0%} of RAM; context {CONTEXT})",
          file=sys.stderr)
    print(table(), end="")
