"""Whether a model directory asks to run its own Python, and the refusal when it may not.

A model repository can name its own classes (`auto_map` in config.json or
tokenizer_config.json, `model_file` in config.json); transformers and mlx-lm then import
that code at load, on every node, with the ranks' rights. It runs only under
`[model] trust_remote_code = true`: otherwise the load is refused before any loader
reads the directory, naming the setting and the files that asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILES = ("config.json", "tokenizer_config.json")


class RemoteCodeRefused(Exception):
    """The model directory asks to run its own code and the settings do not allow it."""


def code_requests(path: Path) -> list[str]:
    """'file: key (code files)' for each config of `path` that names code of its own."""
    found = []
    for name in CONFIG_FILES:
        config = _read(path / name)
        asks = [key for key in ("auto_map", "model_file") if config.get(key)]
        if asks:
            modules = sorted(_modules(config.get("auto_map")) | _modules(config.get("model_file")))
            code = f" ({', '.join(m + '.py' for m in modules)})" if modules else ""
            found.append(f"{path / name}: {', '.join(asks)}{code}")
    return found


def refuse_remote_code(path: Path, trusted: bool) -> None:
    """Raise RemoteCodeRefused when `path` asks to run its own code and `trusted` is off."""
    requests = code_requests(path)
    if requests and not trusted:
        raise RemoteCodeRefused(
            f"model {path} asks to run its own Python code ({'; '.join(requests)}), "
            "which is off by default. Fix: set [model] trust_remote_code = true if you "
            "trust this repository's code (it runs on every node), or use a model "
            "without custom code"
        )


def _read(file: Path) -> dict[str, Any]:
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent or unreadable: the loader itself says so
        return {}
    return config if isinstance(config, dict) else {}


def _modules(value: Any) -> set[str]:
    """The module names an auto_map ("module.Class", "repo--module.Class", lists) or a
    model_file ("module.py") refers to."""
    if isinstance(value, dict):
        return set().union(*(_modules(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_modules(v) for v in value)) if value else set()
    if isinstance(value, str) and value:
        name = value.split("--")[-1]
        return {name.removesuffix(".py") if name.endswith(".py") else name.rsplit(".", 1)[0]}
    return set()
