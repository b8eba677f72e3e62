"""Which model architectures can be pipelined: those whose mlx-lm module uses its
PipelineMixin (read from the installed mlx-lm, so an upgrade that adds one counts), plus
the ones serving/model/ adapts (contract.placement.PIPELINE_ADAPTERS)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from contract.placement import PIPELINE_ADAPTERS


@functools.cache
def pipeline_architectures() -> frozenset[str]:
    spec = importlib.util.find_spec("mlx_lm.models")
    if spec is None or not spec.submodule_search_locations:
        return frozenset(PIPELINE_ADAPTERS)
    folder = Path(next(iter(spec.submodule_search_locations)))
    native = {
        path.stem
        for path in folder.glob("*.py")
        if path.stem != "pipeline" and "PipelineMixin" in path.read_text(encoding="utf-8")
    }
    return frozenset(native | set(PIPELINE_ADAPTERS))


def supports_pipeline(model_type: str) -> bool:
    return _module_name(model_type) in pipeline_architectures()


@functools.cache
def _remapping() -> dict[str, str]:
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:
        return {}
    return dict(MODEL_REMAPPING)


def _module_name(model_type: str) -> str:
    """mlx-lm loads some model types with another's module ("mistral" runs as "llama")."""
    return _remapping().get(model_type, model_type)
