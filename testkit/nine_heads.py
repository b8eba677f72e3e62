"""A tiny random Llama with the bundled SmolLM2's head counts (9 attention heads, 3 KV
heads): tensor parallel at 1 and 3 ranks, pipeline only at 2, as the bundled model is,
for a cost of almost nothing per token and per load.

Multi-host tests whose point is the hosts (placement, links, sync, recovery) use it
instead of the bundled model: the same plan, the same rank counts, a fraction of the CPU.
"""

from __future__ import annotations

from pathlib import Path

from serving.model.bundled import default_cache_dir
from testkit.tiny_model import write_tiny_model

HEADS, KV_HEADS, HIDDEN = 9, 3, 72


def write_nine_heads_model(dest: Path, num_layers: int = 6) -> Path:
    """Write the model into `dest` (its name is the served model's id) and return `dest`."""
    return write_tiny_model(
        dest, num_heads=HEADS, num_kv_heads=KV_HEADS, hidden_size=HIDDEN,
        num_layers=num_layers, model_cache_dir=default_cache_dir(),
    )
