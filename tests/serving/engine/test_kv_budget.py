"""The admission decision and the prefix cache's room, as every rank computes them."""

from __future__ import annotations

from contract.kv_cache import KvLayout, rank_layouts
from contract.model_config import config_info
from serving.engine.kv_budget import KvBudget

# 4 layers, 1 KV head of 64, 1-byte elements: 128 bytes per token and layer.
CONFIG = config_info({"num_hidden_layers": 4, "num_attention_heads": 1, "hidden_size": 64})
PER_LAYER_STEP = 256 * 128  # one 256-token allocation step of one layer


def test_a_short_sequence_beside_a_long_one_costs_the_long_one() -> None:
    """mlx-lm pads the batch to its longest: 100 tokens beside 3,000 take 3,072 too."""
    budget = KvBudget(CONFIG, [KvLayout(range(4), element_bytes=1)], [4 * 24 * PER_LAYER_STEP])
    assert budget.fits([3000, 3000])  # 2 x 12 steps x 4 layers
    assert not budget.fits([3000, 3000, 100])
    assert budget.fits([100] * 24)  # 24 x 1 step
    assert budget.refusal(3000, 3000) is None
    assert budget.refusal(3000, 3200) is not None  # 6,200 tokens: 25 steps, alone


def test_the_tightest_rank_decides_and_every_rank_agrees_on_the_prefix_room() -> None:
    """Pipeline 1 + 3 layers: rank 1 holds 3 layers in a budget equal to rank 0's, so it
    decides admission; the prefix room is the same number of tokens on both ranks."""
    layouts = rank_layouts(CONFIG, 2, [1, 3], kv_bits=None, kv_group_size=64, element_bytes=1)
    budget = KvBudget(CONFIG, layouts, [6 * PER_LAYER_STEP, 6 * PER_LAYER_STEP])
    assert budget.fits([256, 256]) and not budget.fits([256, 256, 256])  # rank 1: 3 x 2 x 1
    running = [200]
    rooms = [budget.prefix_room(rank, running) for rank in (0, 1)]
    # Rank 1's 200 tokens fill 3 of its 6 layer-steps: 256 tokens of its 3 layers remain
    # (rank 0 has 5 x 256 left, the tighter rank decides); both hold that many tokens.
    assert rooms == [256 * 128, 256 * 3 * 128]
