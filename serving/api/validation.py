"""Decode and check OpenAI request bodies; every problem becomes a 400 naming its field."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import msgspec

from contract.openai_errors import ApiError
from contract.openai_schemas import ChatCompletionRequest, ChatMessage, SamplingFields, ToolCall
from contract.settings import RankSettings
from serving.api.errors import check_served, invalid
from serving.api.reasoning import reasoning_fields

T = TypeVar("T")
ROLES = ("system", "user", "assistant", "developer", "tool")
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
# Fields clients send that this server honours only with these (neutral) values.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries, as OpenAI


def decode_body(raw: bytes, kind: type[T]) -> T:
    """Parse JSON into `kind` (a request Struct); malformed JSON and wrong types are 400s."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except UnicodeDecodeError as exc:  # msgspec decodes strings lazily, raising this
        raise invalid(f"The body is not UTF-8: {exc.reason} at byte {exc.start}", None,
                      "invalid_encoding") from exc
    except msgspec.ValidationError as exc:
        if unknown := _UNKNOWN.search(str(exc)):
            field = unknown.group(1)
            raise invalid(
                f"Unrecognized request argument supplied: {field} (this server does not "
                "support it; see the honoured fields in docs/operations.md)",
                field,
                "unsupported_parameter",
            ) from exc
        match = _PATH.search(str(exc))
        raise invalid(f"Invalid request: {exc}", match.group(1) if match else None) from exc
    except msgspec.DecodeError as exc:
        raise invalid(f"Malformed JSON body: {exc}", None, "invalid_json") from exc


def check_request(req: SamplingFields, served: str | frozenset[str], limit: int) -> int | None:
    """Every field of a chat or text completion request checked; the top logprobs asked
    for (None: no logprobs)."""
    check_model(req, served)
    check_sampling(req, requested_max_tokens(req), limit)
    if isinstance(req, ChatCompletionRequest):
        chat_messages(req)
        return chat_logprobs(req)
    return completion_logprobs(req)


def requested_max_tokens(req: SamplingFields) -> int | None:
    if isinstance(req, ChatCompletionRequest):
        return req.max_completion_tokens or req.max_tokens
    return req.max_tokens


def check_model(req: SamplingFields, served: str | frozenset[str]) -> None:
    if req.model is None:
        raise invalid("You must provide a model parameter", "model")
    check_served(req.model, served)


def check_sampling(req: SamplingFields, max_tokens: int | None, limit: int) -> None:
    if req.n != 1:
        raise invalid("Only n=1 is supported", "n")
    for field, neutral in NEUTRAL.items():
        value = getattr(req, field, None)
        if value not in neutral:
            raise invalid(
                f"{field}={value!r} is not supported by this server yet; leave it out",
                field,
                "unsupported_parameter",
            )
    # Above `limit` is no error: admission caps it there (docs/clients.md, "max_tokens").
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise invalid(f"temperature must be in [0, 2], got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_k is not None and req.top_k < 0:
        raise invalid(f"top_k must be >= 0, got {req.top_k}", "top_k")
    _check_range("presence_penalty", req.presence_penalty, -2.0, 2.0)
    _check_range("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    _check_range("repetition_penalty", req.repetition_penalty, 0.0, 10.0)
    if req.repetition_penalty == 0:
        raise invalid("repetition_penalty must be > 0 (1 means none)", "repetition_penalty")
    _check_range("min_p", req.min_p, 0.0, 1.0)
    _check_logit_bias(req.logit_bias)
    stops = stop_list(req)
    if len(stops) > 4 or any(not s for s in stops):
        raise invalid("stop must be up to 4 non-empty strings", "stop")


def _check_range(field: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not low <= value <= high:
        raise invalid(f"{field} must be in [{low:g}, {high:g}], got {value}", field)


TOKEN_ID = re.compile(r"^[0-9]{1,10}$")


def _check_logit_bias(bias: dict[str, float] | None) -> None:
    if not bias:
        return
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"logit_bias may hold up to {MAX_LOGIT_BIAS} tokens", "logit_bias")
    for key, value in bias.items():
        # ASCII digits only, and few: "²".isdigit() is True and int() of it (or of
        # 5000 digits) raises, which would be a 500 for the client's mistake.
        if not TOKEN_ID.match(key):
            raise invalid(f"logit_bias keys must be token ids, got {key[:20]!r}", "logit_bias")
        if not -100 <= value <= 100:
            raise invalid(
                f"logit_bias values must be in [-100, 100], got {value} for {key}", "logit_bias"
            )


def logit_bias_pairs(bias: dict[str, float] | None, vocab_size: int) -> list[tuple[int, float]]:
    pairs = [(int(key), float(value)) for key, value in (bias or {}).items()]
    if any(token >= vocab_size for token, _ in pairs):
        raise invalid(f"logit_bias token ids must be below {vocab_size}", "logit_bias")
    return pairs


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """How many top tokens to report per token (0: the token's only), or None for none."""
    if req.logprobs not in (None, True, False):
        raise invalid("logprobs must be a boolean for chat completions", "logprobs")
    if not req.logprobs:
        if req.top_logprobs:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return _top_count("top_logprobs", req.top_logprobs or 0)


def completion_logprobs(req: SamplingFields) -> int | None:
    if req.top_logprobs is not None:
        raise invalid("top_logprobs is for chat completions; use logprobs: N", "top_logprobs")
    if req.logprobs is None:
        return None
    if isinstance(req.logprobs, bool):
        raise invalid("logprobs must be an integer (top tokens per token)", "logprobs")
    return _top_count("logprobs", req.logprobs)


def _top_count(field: str, value: int) -> int:
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise invalid(f"{field} must be between 0 and {MAX_TOP_LOGPROBS}, got {value}", field)
    return value


def stop_list(req: SamplingFields) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them; text parts only."""
    if not req.messages:
        raise invalid("messages must not be empty", "messages")
    return [_message(i, m) for i, m in enumerate(req.messages)]


def _message(index: int, msg: ChatMessage) -> dict[str, Any]:
    if msg.role not in ROLES:
        raise invalid(
            f"Invalid role {msg.role!r}; expected one of {', '.join(ROLES)}",
            f"messages[{index}].role",
        )
    if isinstance(msg.content, list):
        if any(p.type != "text" for p in msg.content):
            raise invalid("Only text content parts are supported", f"messages[{index}].content")
        text = "".join(p.text or "" for p in msg.content)
    else:
        text = msg.content or ""
    role = "system" if msg.role == "developer" else msg.role
    message: dict[str, Any] = {"role": role, "content": text}
    if msg.tool_calls:
        message["tool_calls"] = [_template_call(index, j, c) for j, c in enumerate(msg.tool_calls)]
    if msg.tool_call_id is not None:
        message["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        message["name"] = msg.name
    if msg.reasoning_content is not None and msg.role == "assistant":
        message.update(reasoning_fields(msg.reasoning_content))
    return message


def _template_call(index: int, j: int, call: ToolCall) -> dict[str, Any]:
    """A call as chat templates expect it: arguments as a mapping, not JSON text."""
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError as exc:
        raise invalid(
            f"arguments must be JSON text: {exc}",
            f"messages[{index}].tool_calls[{j}].function.arguments",
        ) from exc
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": call.type, "function": function}


def effective_max_tokens(requested: int | None, settings: RankSettings) -> int:
    """One rule in every API: a max_tokens above the server's limit is a ceiling, capped
    at the limit (the answer's finish reason says `length` if it gets there)."""
    if requested is None:
        return settings.serving.max_tokens_default
    return min(requested, settings.serving.max_tokens_limit)


def check_context(
    prompt_tokens: int, max_tokens: int, context_length: int, param: str = "messages"
) -> None:
    if prompt_tokens + max_tokens > context_length:
        raise ApiError(
            400,
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param=param,
            code="context_length_exceeded",
        )
