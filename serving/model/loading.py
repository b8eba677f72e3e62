"""Load the model on every rank: plain at world size 1, else tensor-sharded or, when the
settings carry a pipeline split, this rank's range of layers (contract/placement.py)."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from contract.blas import INSTALL_HINT
from contract.model_ref import Bundled, ModelRefError, parse_model_ref
from contract.settings import RankSettings
from serving.blas import loaded_openblas
from serving.distributed import is_peer_lost
from serving.model.remote_code import RemoteCodeRefused, refuse_remote_code

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """The model could not be resolved or loaded."""


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx-lm TokenizerWrapper
    context_length: int
    vocab_size: int
    path: Path
    draft: Any = None  # rank 0's draft model (serving/engine/draft_model.py), if any


def resolve(settings: RankSettings, float32: bool = False, spec: str | None = None) -> Path:
    """A local model directory as is; a `bundled:` spec converted once into the cache
    (`float32`: dequantized, for an optimized BLAS). `spec`: another model than [model]
    path, in the same forms (the draft model)."""
    spec = spec or settings.model.path
    if not _is_bundled(spec):
        path = Path(spec).expanduser()
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model directory {path} has no config.json")
        return path
    from serving.model.bundled import resolve_model  # lazy: pulls in the GGUF converter

    cache = Path(settings.model_cache_dir).expanduser() if settings.model_cache_dir else None
    try:
        return resolve_model(spec, cache_dir=cache, float32=float32)
    except Exception as exc:
        raise ModelLoadError(f"cannot resolve model {spec!r}: {exc}") from exc


def _is_bundled(spec: str) -> bool:
    try:
        return isinstance(parse_model_ref(spec), Bundled)
    except ModelRefError:  # a hub reference reaches no rank: the head resolves it first
        return False


def _bundled_as_float32(settings: RankSettings, group: mx.distributed.Group) -> bool:
    """Whether to serve the bundled model in float32: when every rank has OpenBLAS loaded
    (a collective: every rank must load the same weights)."""
    blas = loaded_openblas()
    if blas:
        log.info("BLAS: OpenBLAS %s, %s threads", blas, os.environ.get("OPENBLAS_NUM_THREADS"))
    elif sys.platform == "linux":
        log.warning("BLAS: MLX's reference BLAS (slow float32 matmuls); for the bundled "
                    "model's fast path: %s", INSTALL_HINT)
    if not _is_bundled(settings.model.path):
        return False
    everywhere = bool(blas)
    if group.size() > 1:
        votes = mx.distributed.all_min(mx.array(int(everywhere)), group=group)
        everywhere = bool(votes.item())
    return everywhere


def load(settings: RankSettings, group: mx.distributed.Group) -> LoadedModel:
    """Load (and shard) the model; logs what this rank loaded and how long it took."""
    path = resolve(settings, float32=_bundled_as_float32(settings, group))
    started = time.monotonic()
    split = settings.pipeline_split
    trust = settings.model.trust_remote_code
    try:
        refuse_remote_code(path, trust)
        model, tokenizer, config = _load_weights(path, group, split, trust)
    except RemoteCodeRefused as exc:
        raise ModelLoadError(str(exc)) from exc
    except Exception as exc:
        if is_peer_lost(exc):
            raise  # sharded_load ends with a barrier: a peer that died there is not our load
        raise ModelLoadError(f"loading {path} failed: {exc}") from exc
    context = settings.model.context_length or int(config.get("max_position_embeddings", 2048))
    vocab = int(config.get("vocab_size", 0)) or len(tokenizer.vocab)
    share = (
        f"pipeline stage with layers [{model.model.start_idx}, {model.model.end_idx})"
        if split and group.size() > 1
        else "tensor shard"
    )
    log.info(
        "loaded %s (%s) as %s %d/%d in %.2f s; context %d tokens",
        path, config.get("model_type", "?"), share, group.rank(), group.size(),
        time.monotonic() - started, context,
    )
    return LoadedModel(model, tokenizer, context, vocab, path)


def _load_weights(
    path: Path, group: mx.distributed.Group, split: list[int] | None, trust: bool
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Plain, tensor-sharded or pipelined; `trust` is passed to every loader explicitly
    (sharded_load's tokenizer defaults to trusting, and an empty dict means that too)."""
    if group.size() > 1 and split:
        return _load_pipeline(path, group, split, trust)
    if group.size() > 1:
        from mlx_lm.utils import sharded_load

        return sharded_load(
            str(path), tensor_group=group, return_config=True,
            tokenizer_config=tokenizer_options(trust), trust_remote_code=trust,
        )
    from mlx_lm import load as plain_load

    return plain_load(  # type: ignore[return-value]
        str(path), tokenizer_options(trust), return_config=True, trust_remote_code=trust
    )


def tokenizer_options(trust: bool) -> dict[str, Any]:
    """What every tokenizer load is given: never empty (mlx-lm reads {} as trusting)."""
    return {"trust_remote_code": trust}


def _load_pipeline(
    path: Path, group: mx.distributed.Group, split: list[int], trust: bool
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """mlx-lm's sharded_load with the orchestrator's memory-weighted split (it would split
    evenly): the weights load lazily, and only this rank's layers are ever read."""
    from mlx_lm.utils import load_model, load_tokenizer

    model, config = load_model(
        path, lazy=True, strict=False, get_model_classes=_model_classes, trust_remote_code=trust
    )
    if not hasattr(model, "model") or not hasattr(model.model, "pipeline"):
        raise ModelLoadError(f"mlx-lm cannot pipeline {config.get('model_type')!r} models")
    model.model.pipeline(group, split)
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(
        path, tokenizer_options(trust), eos_token_ids=config.get("eos_token_id")
    )
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))  # all loaded
    return model, tokenizer, config


def _model_classes(config: dict[str, Any]) -> tuple[type[nn.Module], type]:
    """mlx-lm's own classes, but our pipeline adapters for llama and dense qwen3."""
    from mlx_lm.utils import _get_classes

    from serving.model.pipeline_dense import ADAPTERS

    model_class, args_class = _get_classes(config)
    return ADAPTERS.get(model_class.__module__, model_class), args_class
