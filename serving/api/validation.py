"""Decode and check OpenAI request bodies; every problem becomes a 400 naming its field."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from contract.settings import RankSettings
from serving.api.errors import OpenAIError, invalid, model_not_found
from serving.api.schemas import ChatCompletionRequest, ChatMessage, SamplingFields

T = TypeVar("T", bound=SamplingFields)
ROLES = ("system", "user", "assistant", "developer", "tool")
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
# Fields clients send; honoured only with these (neutral) values for now.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "min_p": (None, 0, 0.0),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}


def decode_body(raw: bytes, kind: type[T]) -> T:
    """Parse JSON into `kind`; malformed JSON and wrong types are 400s."""
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


def check_model(req: SamplingFields, served: str) -> None:
    if req.model is None:
        raise invalid("You must provide a model parameter", "model")
    if req.model != served:
        raise model_not_found(req.model)


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
    if max_tokens is not None and not 1 <= max_tokens <= limit:
        raise invalid(f"max_tokens must be between 1 and {limit}, got {max_tokens}", "max_tokens")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise invalid(f"temperature must be in [0, 2], got {req.temperature}", "temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    if req.top_k is not None and req.top_k < 0:
        raise invalid(f"top_k must be >= 0, got {req.top_k}", "top_k")
    stops = stop_list(req)
    if len(stops) > 4 or any(not s for s in stops):
        raise invalid("stop must be up to 4 non-empty strings", "stop")


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
    return {"role": role, "content": text}


def effective_max_tokens(requested: int | None, settings: RankSettings) -> int:
    return settings.serving.max_tokens_default if requested is None else requested


def check_context(prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    if prompt_tokens + max_tokens > context_length:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param="messages",
            code="context_length_exceeded",
        )
