"""A rank's KV budget at start-up, and MLX's memory limit that follows from it.

Every rank builds the same KvBudget (serving/engine/kv_budget.py): the model's config,
every rank's layout (its layers, its share of the heads) and every rank's budget in
bytes: `[serving] kv_cache_gb`, else what preflight's placement left on each node after
the weights and the reserve (RankSettings.kv_budget_bytes), else, for a rank started by
hand, the memory available once loaded, split among the ranks on the machine, the
smallest rank's (a collective). Without `memory_limit_gb`, MLX's limit becomes this
rank's weights plus its KV budget plus headroom, so that outgrowing the budget fails an
allocation (`oom`) instead of swapping a Mac until it freezes.
"""

from __future__ import annotations

import json
import logging

import mlx.core as mx
import psutil
from mlx.utils import tree_flatten

from contract.kv_cache import rank_layouts
from contract.model_config import config_info
from contract.settings import RankSettings
from serving.engine.kv_budget import KvBudget
from serving.machine import ranks_on_machine
from serving.memory_limit import apply_memory_limit
from serving.model.loading import LoadedModel

log = logging.getLogger("serving.rank")
HEADROOM_SHARE = 0.10  # of weights + KV, for activations and transient copies
MIN_HEADROOM_BYTES = 1 << 30


def build_kv_budget(
    settings: RankSettings, loaded: LoadedModel, group: mx.distributed.Group
) -> KvBudget:
    """This launch's KvBudget (a collective when no budget was given: all ranks call it)."""
    config = config_info(json.loads((loaded.path / "config.json").read_text(encoding="utf-8")))
    layouts = rank_layouts(
        config, group.size(), settings.pipeline_split, kv_bits=settings.serving.kv_bits,
        kv_group_size=settings.serving.kv_group_size, kv_window=settings.serving.kv_window,
        element_bytes=activation_bytes(loaded.model))
    kv = KvBudget(config, layouts, _budgets(settings, group))
    rank = group.rank()
    log.info("KV budget %.3f GB on this rank (%d tokens alone)",
             kv.budgets[rank] / 1e9, kv.tokens_alone(rank))
    return kv


def limit_memory(settings: RankSettings, kv: KvBudget, rank: int, weights: int) -> None:
    """MLX's limits once the batch is built: mlx-lm's BatchGenerator sets the wired limit to
    the GPU's recommended working set when it starts, so ours go after it. `weights`: the
    memory MLX held once the model was loaded."""
    configured = settings.serving.memory_limit_gb
    if configured is not None:
        apply_memory_limit(configured)
    else:
        apply_memory_limit(budget_limit_bytes(weights, kv.budgets[rank]) / 1e9)


def activation_bytes(model: object) -> int:
    """Bytes per element of the activations, hence the KV cache: the widest floating dtype
    among the weights (float32 norms beside float16 scales compute in float32)."""
    params = tree_flatten(model.parameters())  # type: ignore[attr-defined]
    arrays = [value for _, value in params] if isinstance(params, list) else []
    sizes = [
        value.dtype.size for value in arrays
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating)
    ]
    return max(sizes, default=2)


def budget_limit_bytes(weights: int, kv_budget: int) -> int:
    """MLX's memory limit from the budget: weights, KV and headroom for activations."""
    held = weights + kv_budget
    return held + max(MIN_HEADROOM_BYTES, int(held * HEADROOM_SHARE))


def _budgets(settings: RankSettings, group: mx.distributed.Group) -> list[int]:
    ranks = group.size()
    configured = settings.serving.kv_cache_gb
    if configured is not None:
        return [int(configured * 1e9)] * ranks
    placed = settings.kv_budget_bytes
    if placed is not None and len(placed) == ranks:
        return list(placed)
    measured = psutil.virtual_memory().available // ranks_on_machine()
    if ranks > 1:  # float32 in MB holds it to ~7 digits, the same value on every rank
        agreed = mx.distributed.all_min(mx.array(measured / 1e6, dtype=mx.float32), group=group)
        measured = int(float(agreed.item()) * 1e6)  # type: ignore[arg-type]
    return [measured] * ranks
