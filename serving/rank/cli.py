"""Command line of the rank program: a settings file, or flags for development."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from contract.settings import RankSettings, SettingsError, load_settings

# Flags for development, each onto one field: (table or "" for the top level, field, type).
_FLAGS: dict[str, tuple[str, str, type]] = {
    "model": ("model", "path", str),
    "served_model_id": ("model", "id", str),
    "context_length": ("model", "context_length", int),
    "api_host": ("", "api_host", str),
    "api_port": ("serving", "rank_api_port", int),
    "max_batch_size": ("serving", "max_batch_size", int),
    "max_tokens_default": ("serving", "max_tokens_default", int),
    "max_tokens_limit": ("serving", "max_tokens_limit", int),
    "keepalive_s": ("serving", "keepalive_s", float),
    "request_timeout_s": ("serving", "request_timeout_s", float),
    "queue_limit": ("serving", "queue_limit", int),
    "shutdown_grace_s": ("", "shutdown_grace_s", float),
    "model_cache_dir": ("", "model_cache_dir", str),
    "log_level": ("serving", "log_level", str),
    "prompt_cache_size": ("serving", "prompt_cache_size", int),
    "speculative": ("serving", "speculative", str),
    "num_draft_tokens": ("serving", "num_draft_tokens", int),
    "draft_model": ("serving", "draft_model", str),
}
_ALIASES = {"api_port": ["--port"], "api_host": ["--host"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving",
        description="One tensor-parallel serving rank (rank 0 also serves the OpenAI API). "
        "Distributed env: MLX_RANK + MLX_HOSTFILE (ring) or MLX_RANK + "
        "MLX_JACCL_COORDINATOR + MLX_IBV_DEVICES (jaccl); none = a single rank.",
    )
    parser.add_argument("--settings", type=Path, help="JSON settings file (RankSettings)")
    for name, (_, _, kind) in _FLAGS.items():
        flags = [f"--{name.replace('_', '-')}", *_ALIASES.get(name, [])]
        parser.add_argument(*flags, dest=name, type=kind, default=None)
    parser.add_argument("--comm-profile", action="store_true", default=None)
    return parser


def parse_settings(argv: list[str] | None = None) -> RankSettings:
    """Settings from --settings, with any explicit flags overriding it; SettingsError if invalid."""
    args = build_parser().parse_args(argv)
    data: dict[str, Any] = {"model": {}, "serving": {}}
    if args.settings is not None:
        data = msgspec.to_builtins(load_settings(args.settings))
        data.setdefault("serving", {})
    elif args.model is None:
        raise SettingsError("give --settings FILE or --model SPEC")
    if args.comm_profile:
        data["serving"]["comm_profile"] = True
    for name, (table, field, _) in _FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            (data[table] if table else data)[field] = value
    try:
        return msgspec.convert(data, RankSettings)
    except msgspec.ValidationError as exc:
        raise SettingsError(str(exc)) from exc
