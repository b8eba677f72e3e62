"""What every rank does before it serves: join the group, load the model, build the batch,
and, when that fails, pick the exit code that says why."""

from __future__ import annotations

import logging
import os

import mlx.core as mx
import psutil
from mlx_lm.models.cache import make_prompt_cache

from contract.exit_codes import RankExit
from contract.settings import RankSettings
from serving.distributed import DistributedEnv, barrier, init_group, is_peer_lost
from serving.engine.batch import MirroredBatch
from serving.engine.grammar import GrammarCompiler
from serving.engine.kv_quant import KVQuantUnsupported
from serving.engine.kv_quant import check_model as check_kv_quant
from serving.engine.speculative import SpeculationUnsupported, check_model
from serving.faults import FaultPlan
from serving.machine import ranks_on_machine
from serving.memory_limit import apply_memory_limit, is_out_of_memory
from serving.model.loading import LoadedModel, ModelLoadError, load
from serving.rank.kv_setup import build_kv_budget, limit_memory

log = logging.getLogger("serving.rank")
DEFAULT_CACHE_SHARE = 0.25  # of the memory available once the weights are loaded


class DistributedInitError(Exception):
    """mx.distributed.init failed."""


def join_group(env: DistributedEnv) -> mx.distributed.Group:
    """Init the backend (blocks until every rank has connected)."""
    try:
        group = init_group(env)
    except Exception as exc:
        raise DistributedInitError(f"distributed init ({env.backend}) failed: {exc}") from exc
    log.info("rank %d of %d (backend %s) pid %d", group.rank(), group.size(),
             env.backend or "single", os.getpid())
    return group


def load_and_sync(
    settings: RankSettings, group: mx.distributed.Group, faults: FaultPlan
) -> LoadedModel:
    faults.on_load()
    apply_memory_limit(settings.serving.memory_limit_gb)
    loaded = load(settings, group)
    faults.decode = loaded.tokenizer.decode
    if settings.serving.speculative == "draft" and group.rank() == 0:
        from serving.engine.draft_model import load_draft  # rank 0 alone: no collectives

        loaded.draft = load_draft(settings, loaded)
    barrier(group)
    log.info("all %d ranks loaded", group.size())
    return loaded


def make_batch(
    settings: RankSettings, loaded: LoadedModel, group: mx.distributed.Group
) -> MirroredBatch:
    serving = settings.serving
    if serving.speculative != "off":
        check_model(loaded.model)  # this rank's layers: every rank refuses alike
    weights = mx.get_active_memory()
    if serving.kv_bits is not None:
        log.info("KV cache quantized to %d bits (group %d, the last %d tokens exact): %s",
                 serving.kv_bits, serving.kv_group_size, serving.kv_window,
                 check_kv_quant(loaded.model, serving.kv_group_size))
    batch = MirroredBatch(
        loaded.model,
        set(loaded.tokenizer.eos_token_ids),
        loaded.vocab_size,
        serving.max_batch_size,
        serving.prefill_step_size,
        serving.prompt_cache_size,
        prompt_cache_bytes(settings, group, _cache_layers(settings, loaded, group)),
        # Every rank builds its own: the plan carries the grammar, never a mask.
        GrammarCompiler(
            loaded.tokenizer._tokenizer, loaded.vocab_size, list(loaded.tokenizer.eos_token_ids)),
        kv=build_kv_budget(settings, loaded, group),
        rank=group.rank(),
        kv_bits=serving.kv_bits,
        kv_group_size=serving.kv_group_size,
        kv_window=serving.kv_window,
    )
    assert batch.kv is not None
    limit_memory(settings, batch.kv, group.rank(), weights)
    return batch


def prompt_cache_bytes(
    settings: RankSettings, group: mx.distributed.Group, layers: int | None = 1
) -> int:
    """The prefix cache's byte bound (a collective: all ranks call it).

    By default a share of the memory left once every rank has loaded, split among the
    ranks on this machine: each sees the same free memory, and a cache each sized from
    all of it would promise that memory several times over. Every rank must evict alike,
    so the bound is agreed per layer of cache and scaled by this rank's `layers`: equal
    everywhere in tensor mode (1), its own layer count in pipeline mode, where an entry's
    size follows the rank's layers. None: this launch keeps no prefix cache."""
    if layers is None:
        return 0
    configured = settings.serving.prompt_cache_gb
    split = settings.pipeline_split if group.size() > 1 else None
    if configured is not None:  # the rank with the most layers holds what is configured
        return int(configured * 1e9) * layers // (max(split) if split else 1)
    sharing = ranks_on_machine()
    per_layer = int(psutil.virtual_memory().available * DEFAULT_CACHE_SHARE / sharing) // layers
    if group.size() > 1:
        # float32 holds it to ~7 digits: plenty, and every rank gets the very same value.
        agreed = mx.distributed.all_min(mx.array(per_layer / 1e6, dtype=mx.float32), group=group)
        per_layer = int(float(agreed.item()) * 1e6)  # type: ignore[arg-type]
    bound = per_layer * layers
    log.info("prefix cache bound %.2f GB on this rank (%d on this machine)",
             bound / 1e9, sharing)
    return bound


def _cache_layers(
    settings: RankSettings, loaded: LoadedModel, group: mx.distributed.Group
) -> int | None:
    """How many per-layer caches an entry holds here, for prompt_cache_bytes: 1 in tensor
    mode (every rank's entries are equal), this rank's layers in pipeline mode. None when a
    pipelined model mixes cache kinds (sliding or linear-attention layers beside full
    ones): entry sizes then differ between ranks out of proportion, and ranks evicting
    differently would desync, so no prefix cache (decided alike on every rank)."""
    if not settings.pipeline_split or group.size() == 1:
        return 1
    caches = make_prompt_cache(loaded.model)
    mixed = int(len({type(cache) for cache in caches}) > 1)
    if mx.distributed.all_max(mx.array(mixed), group=group).item():
        log.warning("prefix cache off: this model's layers keep different kinds of cache, "
                    "which pipeline ranks cannot evict alike")
        return None
    return len(caches)


def exit_for(exc: BaseException) -> RankExit:
    """Log a rank's fatal failure and pick its exit code."""
    if isinstance(exc, DistributedInitError):
        log.error("%s", exc)
        return RankExit.DISTRIBUTED_INIT_FAILED
    if isinstance(exc, SpeculationUnsupported | KVQuantUnsupported):
        log.error("%s", exc)
        return RankExit.CONFIG_ERROR
    if isinstance(exc, ModelLoadError):
        log.error("%s", exc)
        return RankExit.MODEL_LOAD_FAILED
    if is_peer_lost(exc):
        log.error("peer lost: %s", exc)
        return RankExit.PEER_LOST
    if is_out_of_memory(exc):
        log.error("out of memory: %s", exc)
        return RankExit.OUT_OF_MEMORY
    log.exception("internal error", exc_info=exc)
    return RankExit.INTERNAL_ERROR
