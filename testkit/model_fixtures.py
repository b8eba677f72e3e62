"""Session fixtures for models: the converted bundled model and a tiny random Llama.

The bundled model is converted into the same cache the rank program uses
(~/.cache/mlx-cluster-orchestrator/models, or $ORCHESTRATOR_MODEL_CACHE), so it is
converted once per machine, not once per test run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.model_ref import BUNDLED_PREFIX
from serving.model.bundled import default_cache_dir, resolve_model
from testkit import require
from testkit.tiny_model import write_tiny_model

BUNDLED_SPEC = BUNDLED_PREFIX + "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The mlx-lm directory of bundled:smollm2-135m-instruct as ranks here serve it: float32
    where OpenBLAS is installed (the fast path on CPU), else 4-bit (where CI requires
    OpenBLAS, its absence fails instead: testkit/require.py)."""
    float32 = require.openblas() is not None
    return resolve_model(BUNDLED_SPEC, default_cache_dir(), float32=float32)


@pytest.fixture(scope="session")
def bundled_quantized_dir() -> Path:
    """The bundled model in its 4-bit form, as Macs serve it."""
    return resolve_model(BUNDLED_SPEC, default_cache_dir())


@pytest.fixture(scope="session")
def tiny_model_dir(
    tmp_path_factory: pytest.TempPathFactory, bundled_quantized_dir: Path
) -> Path:
    """A tiny random Llama (8 heads / 4 KV heads, 2 layers, hidden 64, seed 0)."""
    return write_tiny_model(
        tmp_path_factory.mktemp("tiny-model"), model_cache_dir=default_cache_dir()
    )
