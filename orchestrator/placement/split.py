"""A memory-weighted pipeline split: contiguous layer ranges, one per rank, sized in
proportion to what each rank's node can hold.

mlx-lm's PipelineMixin gives the model's first layers to the last rank and its last
layers to rank 0 (rank r runs after ranks r+1 ... n-1), and takes the split as a layer
count per rank; this module speaks the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise


def layer_counts(layer_costs: Sequence[float], capacities: Sequence[float]) -> list[int]:
    """Layers per rank (indexed by rank) whose costs are in proportion to each rank's
    capacity; every rank gets at least one layer."""
    ranks, layers = len(capacities), len(layer_costs)
    if not 0 < ranks <= layers:
        raise ValueError(f"cannot split {layers} layers over {ranks} ranks")
    stage_capacity = list(reversed(capacities))  # stage s is rank n-1-s: first layers first
    total_capacity = sum(max(c, 0.0) for c in stage_capacity) or float(ranks)
    cumulative = list(accumulate(layer_costs))
    total_cost = cumulative[-1]
    bounds, start = [], 0
    for stage, reached in enumerate(accumulate(max(c, 0.0) for c in stage_capacity[:-1])):
        target = total_cost * reached / total_capacity
        # The boundary nearest the target, leaving at least one layer for every stage.
        lowest, highest = start + 1, layers - (ranks - 1 - stage)
        end = min(range(lowest, highest + 1), key=lambda e: abs(cumulative[e - 1] - target))
        bounds.append(end)
        start = end
    edges = [0, *bounds, layers]
    stage_counts = [b - a for a, b in pairwise(edges)]
    return list(reversed(stage_counts))


def layer_ranges(counts: Sequence[int]) -> list[range]:
    """Each rank's layers in the model's numbering, from per-rank counts (mlx-lm's order)."""
    ranges = []
    for rank in range(len(counts)):
        start = sum(counts[rank + 1 :])
        ranges.append(range(start, start + counts[rank]))
    return ranges
