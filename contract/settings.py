"""The one settings type of a serving rank, and the cluster.toml tables it is made of.

cluster.toml's `[model]` and `[serving]` tables are `ModelSettings` and `ServingSettings`
themselves: the orchestrator parses them, puts them into a `RankSettings` with what only
it knows (rank 0's API address, the stop grace), and writes that as JSON into every
rank's directory. Nothing is copied field by field, and the limits are declared once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import msgspec
from msgspec import Meta

from contract.model_ref import BUNDLED_PREFIX, ModelRefError, parse_model_ref

Port = Annotated[int, Meta(ge=1, le=65535)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
NonNegativeSeconds = Annotated[float, Meta(ge=0)]

DEFAULT_MODEL = BUNDLED_PREFIX + "smollm2-135m-instruct"


class SettingsError(ValueError):
    """The settings file or flags are invalid."""


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every settings table: unknown keys are errors, so typos never pass silently."""


class ModelSettings(Section):
    # A model reference (contract/model_ref.py): "bundled:<name>", a model directory
    # present on every node, or a hub model, hf: ORG/NAME[@REV]: pulled once to this
    # machine, then synced to <store>/models--ORG--NAME/snapshots/<commit> on every node
    # (orchestrator/models/location.py).
    path: str = DEFAULT_MODEL
    # The id clients pass as `model`; defaults to the path's last component (hf: NAME).
    id: str | None = None
    # More names rank 0 answers to as this model (the gateway routes them here), e.g.
    # Claude Code's small fast model name.
    aliases: list[str] = msgspec.field(default_factory=list)
    # hf: models only: the Hugging Face cache directory they live in, the same path on every
    # node; None: this machine's HF cache (HF_HUB_CACHE, else ~/.cache/huggingface/hub).
    store: str | None = None
    # Longest prompt + completion in tokens; None takes the model's own limit.
    context_length: PositiveInt | None = None
    # `up` first copies the model directory to every node that lacks it or holds another
    # copy (what `orchestrator sync` does), from sync_from: a node's name, or None for the
    # machine the orchestrator runs on. Never for `bundled:` models.
    sync: bool = False
    sync_from: str | None = None
    # Sync node by node along the ring: each node fetches from its neighbour that holds a
    # verified copy (over their cable's addresses), so the source sends the model once.
    sync_forwarding: bool = False
    # Let the model directory run its own Python (an `auto_map` in config.json or
    # tokenizer_config.json, a `model_file`) on every node, with the ranks' rights; off:
    # such a model is refused, and `pull` fetches no `*.py`.
    trust_remote_code: bool = False

    @property
    def served_id(self) -> str:
        if self.id:
            return self.id
        try:
            return parse_model_ref(self.path).default_id
        except ModelRefError:  # the config check names it; meanwhile the last path part
            return self.path.rstrip("/").rsplit("/", 1)[-1]


MAX_DRAFT_TOKENS = 16  # verifying more per step costs more than a match that long saves


class ServingSettings(Section):
    max_batch_size: PositiveInt = 8  # sequences decoded together (continuous batching)
    max_tokens_default: PositiveInt = 512  # when a request gives no max_tokens
    max_tokens_limit: PositiveInt = 4096  # the most a request may ask for
    # Idle workers sleep most of this between keepalives (MLX's ring busy-polls in a
    # collective), so it bounds the first request's extra wait after an idle spell.
    keepalive_s: PositiveSeconds = 0.5
    request_timeout_s: PositiveSeconds = 600.0  # a request running longer ends with an error
    queue_limit: PositiveInt = 64  # requests waiting for a batch slot before 429
    # Rank 0's internal OpenAI API, on rank 0's node; the gateway proxies to it.
    rank_api_port: Port = 52200
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 4 * 1024 * 1024  # larger bodies get 413
    # The most prompt tokens a sequence prefills per engine step (all of them when nothing
    # else is decoding): larger prefills a long prompt alone faster.
    prefill_step_size: PositiveInt = 512
    # While streams decode, a prompt's chunk is sized so a step lasts at most this many
    # decode-only steps: their inter-token latency stretches no further while a long
    # prompt is read. Larger reads it sooner; 0: off (always prefill_step_size).
    prefill_max_slowdown: Annotated[float, Meta(ge=0)] = 2.5
    prompt_cache_size: NonNegativeInt = 10  # finished sequences kept for prefix reuse; 0: off
    # Bytes of KV the prefix cache may hold on each rank; None: a quarter of the memory
    # available once the weights are loaded, split among the ranks sharing a machine, the
    # smallest of all ranks (so all evict alike).
    prompt_cache_gb: Annotated[float, Meta(ge=0)] | None = None
    # MLX's memory limit on each rank (and on a Mac its wired limit): past it an
    # allocation fails and the rank exits, classified `oom` (serving/memory_limit.py).
    # None: MLX's own default.
    memory_limit_gb: Annotated[float, Meta(gt=0)] | None = None
    # Bytes of KV each rank may hold for running sequences and the prefix cache; rank 0
    # admits a request only when its prompt plus max_tokens fit. None: what preflight
    # leaves after the weights and the reserve, the smallest rank deciding.
    kv_cache_gb: Annotated[float, Meta(gt=0)] | None = None
    # Quantize the KV cache of full-attention layers to this many bits (about 0.53x / 0.28x
    # of 16-bit at 8 / 4 bits with groups of 64); None: unquantized. kv_group_size values
    # share one scale and bias; it must divide the model's head size (checked at start-up).
    kv_bits: Literal[4, 8] | None = None
    kv_group_size: Literal[32, 64, 128] = 64
    # With kv_bits: each sequence's most recent kv_window tokens stay exact (unquantized),
    # older ones are quantized in blocks as they leave it; 0: every token quantized.
    kv_window: Annotated[int, Meta(ge=0, le=4096)] = 64
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    comm_profile: bool = False  # time each plan broadcast alone (drains the stream first)
    # Speculative decoding while one request runs alone: "prompt_lookup" drafts from the
    # prompt and text so far, "draft" from draft_model (serving/engine/speculative.py).
    speculative: Literal["off", "prompt_lookup", "draft"] = "off"
    # speculative = "draft": a small model of the same tokenizer, in [model] path's forms
    # (a directory, bundled:NAME); rank 0 alone loads and runs it, unsharded.
    draft_model: str | None = None
    num_draft_tokens: Annotated[int, Meta(ge=1, le=MAX_DRAFT_TOKENS)] = 4  # drafts per step


class RankSettings(Section):
    """What a rank needs to know; identical on every rank of a launch."""

    model: ModelSettings
    serving: ServingSettings = msgspec.field(default_factory=ServingSettings)
    api_host: str = "127.0.0.1"  # rank 0's internal API listens here
    shutdown_grace_s: NonNegativeSeconds = 10.0  # how long SIGTERM waits for in-flight requests
    model_cache_dir: str | None = None  # where bundled models are converted; None = default
    # Pipeline parallelism: layers per rank, indexed by rank (mlx-lm's split: rank 0 runs
    # the last layers); None: tensor parallel (contract/placement.py).
    pipeline_split: list[PositiveInt] | None = None
    # Rank 0's /v1 routes require the secret held in this file of its working directory
    # (contract/launch_secret.py); None: no secret (a rank started by hand, tests).
    api_secret_file: str | None = None
    # KV bytes each rank may hold, indexed by rank: what preflight's placement leaves on
    # its node after the weights and the reserve (serving.kv_cache_gb unset); None: the
    # rank measures what is left once loaded (serving/rank/kv_setup.py).
    kv_budget_bytes: list[NonNegativeInt] | None = None
    # TLS for that API when it listens beyond loopback: the key and certificate files in
    # its working directory (made per launch; the gateway pins the certificate); None: HTTP.
    api_tls_key_file: str | None = None
    api_tls_cert_file: str | None = None

    def __post_init__(self) -> None:
        problems = settings_problems(self.model, self.serving)
        if problems:
            raise SettingsError("; ".join(f"{p.path}: {p.message}" for p in problems))


class Problem(NamedTuple):
    path: str  # the field, as cluster.toml spells it ("serving.max_tokens_default")
    message: str
    fix: str


def settings_problems(model: ModelSettings, serving: ServingSettings) -> list[Problem]:
    """What the field types cannot say: rules that span fields, and empty strings."""
    problems = []
    if not model.path.strip():
        problems.append(
            Problem("model.path", "is empty", "give the model directory's path on every node")
        )
    if model.id is not None and not model.id.strip():
        problems.append(
            Problem("model.id", "is empty", "remove it to use the model's directory name")
        )
    problems.extend(_draft_problems(serving))
    if serving.max_tokens_default > serving.max_tokens_limit:
        problems.append(
            Problem(
                "serving.max_tokens_default",
                f"{serving.max_tokens_default} is above max_tokens_limit "
                f"{serving.max_tokens_limit}",
                "lower it or raise max_tokens_limit",
            )
        )
    return problems


def _draft_problems(serving: ServingSettings) -> list[Problem]:
    """speculative = "draft" and draft_model go together."""
    if serving.speculative == "draft" and not (serving.draft_model or "").strip():
        return [Problem("serving.draft_model", 'is missing (speculative = "draft")',
                        "give a small model of the same tokenizer (a directory or "
                        'bundled:NAME), or set speculative = "prompt_lookup"')]
    if serving.draft_model is not None and serving.speculative != "draft":
        return [Problem("serving.draft_model",
                        f"is set but speculative is {serving.speculative!r}",
                        'set speculative = "draft", or remove draft_model')]
    return []


def load_settings(path: Path) -> RankSettings:
    """Read settings from a JSON file; raises SettingsError with the reason."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=RankSettings)
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise SettingsError(f"invalid settings file {path}: {exc}") from exc


def encode_settings(settings: RankSettings) -> bytes:
    """The JSON the orchestrator writes into each rank's directory."""
    return msgspec.json.format(msgspec.json.encode(settings))


def dump_settings(settings: RankSettings, path: Path) -> None:
    path.write_bytes(encode_settings(settings))
