"""Command line of the rank program: a settings file, or flags for development."""

from __future__ import annotations

import argparse
from pathlib import Path

from serving.settings import RankSettings, SettingsError, load_settings

# Flags that map one-to-one onto RankSettings fields (development use).
_FLAGS: dict[str, type] = {
    "model": str, "served_model_id": str, "context_length": int, "api_host": str,
    "api_port": int, "max_batch_size": int, "max_tokens_default": int,
    "max_tokens_limit": int, "keepalive_s": float, "request_timeout_s": float,
    "queue_limit": int, "launch_id": str, "shutdown_grace_s": float,
    "model_cache_dir": str, "log_level": str, "prompt_cache_size": int,
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
    for name, kind in _FLAGS.items():
        flags = [f"--{name.replace('_', '-')}", *_ALIASES.get(name, [])]
        parser.add_argument(*flags, dest=name, type=kind, default=None)
    parser.add_argument("--comm-profile", action="store_true", default=None)
    return parser


def parse_settings(argv: list[str] | None = None) -> RankSettings:
    """Settings from --settings, with any explicit flags overriding it; SettingsError if invalid."""
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "settings" and v is not None}
    if args.settings is not None:
        base = load_settings(args.settings)
        fields = {f: getattr(base, f) for f in base.__struct_fields__}
        fields.update(overrides)
    else:
        fields = overrides
    if "model" not in fields:
        raise SettingsError("give --settings FILE or --model SPEC")
    try:
        return RankSettings(**fields)
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from exc
