"""Settings of one serving rank: written by the orchestrator as JSON, or built from CLI flags."""

from __future__ import annotations

from pathlib import Path

import msgspec


class SettingsError(ValueError):
    """The settings file or flags are invalid."""


class RankSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a rank needs to know; identical on every rank of a launch."""

    model: str  # "bundled:<name>" or a local mlx-lm model directory
    served_model_id: str | None = None  # the id clients send as "model"; None = derived from model
    context_length: int | None = None  # None = max_position_embeddings of the model config
    api_host: str = "127.0.0.1"  # rank 0's internal OpenAI API
    api_port: int = 8100
    max_batch_size: int = 8  # sequences decoded together (continuous batching)
    max_tokens_default: int = 256  # when a request gives no max_tokens
    max_tokens_limit: int = 4096  # upper bound a request may ask for
    keepalive_s: float = 0.1  # idle interval between empty plans (dead-peer detection)
    request_timeout_s: float = 600.0  # a request still running after this ends with an error
    queue_limit: int = 64  # requests waiting for a batch slot before 429
    launch_id: str | None = None  # None = env MLX_LAUNCH_ID, else "dev"
    shutdown_grace_s: float = 30.0  # how long SIGTERM waits for in-flight requests
    max_body_bytes: int = 4 * 1024 * 1024  # larger request bodies get 413
    model_cache_dir: str | None = None  # where bundled models are converted; None = default
    prefill_step_size: int = 2048
    prompt_cache_size: int = 10  # finished sequences kept for prefix reuse; 0 disables
    log_level: str = "INFO"
    comm_profile: bool = False  # time each plan broadcast alone (drains the stream first)

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise SettingsError("; ".join(problems))


def _problems(s: RankSettings) -> list[str]:
    checks = [
        (bool(s.model.strip()), "model: must not be empty"),
        (s.context_length is None or s.context_length > 0, "context_length: must be > 0"),
        (0 < s.api_port < 65536, "api_port: must be 1..65535"),
        (s.max_batch_size >= 1, "max_batch_size: must be >= 1"),
        (s.max_tokens_limit >= 1, "max_tokens_limit: must be >= 1"),
        (
            1 <= s.max_tokens_default <= s.max_tokens_limit,
            "max_tokens_default: must be 1..max_tokens_limit",
        ),
        (s.keepalive_s > 0, "keepalive_s: must be > 0"),
        (s.request_timeout_s > 0, "request_timeout_s: must be > 0"),
        (s.queue_limit >= 1, "queue_limit: must be >= 1"),
        (s.shutdown_grace_s >= 0, "shutdown_grace_s: must be >= 0"),
        (s.max_body_bytes >= 1024, "max_body_bytes: must be >= 1024"),
        (s.prefill_step_size >= 1, "prefill_step_size: must be >= 1"),
        (s.prompt_cache_size >= 0, "prompt_cache_size: must be >= 0"),
    ]
    return [message for ok, message in checks if not ok]


def load_settings(path: Path) -> RankSettings:
    """Read settings from a JSON file; raises SettingsError with the reason."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=RankSettings)
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SettingsError(f"invalid settings file {path}: {exc}") from exc


def dump_settings(settings: RankSettings, path: Path) -> None:
    """Write settings as JSON (what the orchestrator does before a launch)."""
    path.write_bytes(msgspec.json.format(msgspec.json.encode(settings)))


def served_model_id(settings: RankSettings) -> str:
    """The model id the API reports and accepts."""
    if settings.served_model_id:
        return settings.served_model_id
    if settings.model.startswith("bundled:"):
        return settings.model.removeprefix("bundled:")
    return Path(settings.model).expanduser().name or settings.model
