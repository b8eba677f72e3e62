"""How many full-context sequences each rank's KV budget holds, for preflight and `plan`.

A rank's KV budget is `[serving] kv_cache_gb`, else what its memory budget leaves after
its weights (the ranks then take the smallest, in sequences: serving/engine/kv_budget.py).
Running more sequences than fit only makes requests wait in the queue, so a launch is
refused only when not even one full-context sequence fits.
"""

from __future__ import annotations

from contract.fingerprint import ModelConfigInfo
from contract.kv_cache import allocated_tokens, rank_layouts, sequence_kv_bytes
from contract.placement import Placement
from orchestrator.config import ClusterSpec

GIB = 1024**3


def fill_kv(
    placement: Placement, config: ModelConfigInfo, context: int, spec: ClusterSpec
) -> str | None:
    """Set each share's KV budget and full-context sequences; why it cannot run, or None."""
    placement.context = context
    layouts = rank_layouts(config, len(placement.ranks), placement.pipeline_split,
                           kv_bits=spec.serving.kv_bits,
                           kv_group_size=spec.serving.kv_group_size,
                           kv_window=spec.serving.kv_window)
    configured = spec.serving.kv_cache_gb
    short = []
    for share, layout in zip(placement.ranks, layouts, strict=True):
        if configured is not None:
            share.kv_budget_bytes = int(configured * 1e9)
        elif share.budget_bytes is not None:
            share.kv_budget_bytes = max(share.budget_bytes - share.weight_bytes, 0)
        one = sequence_kv_bytes(config, layout, allocated_tokens(context))
        if share.kv_budget_bytes is None or not one:
            continue
        share.kv_sequences = share.kv_budget_bytes // one
        if configured is not None and not share.kv_sequences:
            short.append(f"rank {share.rank} on {share.node} needs {one / 1e9:.2f} GB of KV "
                         f"for one {context}-token sequence")
    if not short:
        return None
    return (f"[serving] kv_cache_gb = {configured} cannot hold even one full-context "
            f"sequence: {'; '.join(short)}")


def fit_sentence(placement: Placement, max_batch_size: int) -> str:
    """One line: how many full-context sequences fit beside the weights, smallest rank."""
    context = placement.context
    known = [s for s in placement.ranks if s.kv_sequences is not None]
    if not known:
        return f"KV budget: unknown (node memory unknown); context {context} tokens"
    deciding = min(known, key=lambda s: s.kv_sequences or 0)
    fit, budget = deciding.kv_sequences or 0, deciding.kv_budget_bytes or 0
    beyond = (f"; max_batch_size {max_batch_size}: the rest wait in the queue"
              if fit < max_batch_size else "")
    return (f"KV budget {budget / 1e9:.2f} GB on rank {deciding.rank}: {fit} full-context sequence"
            f"{'s' if fit != 1 else ''} of {context} tokens fit{beyond}")
