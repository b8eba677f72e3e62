"""The memory-weighted split: contiguous ranges in mlx-lm's rank order, by bytes."""

from __future__ import annotations

import pytest

from orchestrator.placement.split import layer_counts, layer_ranges


def test_split_follows_capacity() -> None:
    """Capacities 2 : 1 : 1 give rank 0 about half the layers; rank 0 runs the last."""
    counts = layer_counts([1.0] * 30, [2.0, 1.0, 1.0])
    assert counts == [15, 8, 7]
    assert layer_ranges(counts) == [range(15, 30), range(7, 15), range(0, 7)]


def test_split_weighs_bytes_not_layers() -> None:
    """A heavy first layer (a dense layer, embeddings) leaves its rank fewer layers."""
    counts = layer_counts([10.0] + [1.0] * 19, [1.0, 1.0])
    assert counts[1] < counts[0]  # rank 1 holds layer 0
    assert sum(counts) == 20


def test_every_rank_gets_a_layer() -> None:
    assert layer_counts([1.0] * 3, [100.0, 1.0, 1.0]) == [1, 1, 1]
    with pytest.raises(ValueError, match="cannot split 2 layers over 3 ranks"):
        layer_counts([1.0, 1.0], [1.0, 1.0, 1.0])
