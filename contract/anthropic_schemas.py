"""Anthropic's Messages API (`POST /v1/messages`) request, response, stream and error bodies.

Rank 0 decodes and encodes with them (serving/api/messages.py); the gateway publishes them
in its OpenAPI document and forwards the bytes. As with the OpenAI bodies, requests refuse
unknown fields, so a field this server cannot honour is a 400 naming it. The fields the
current SDK and Claude Code send are all declared; docs/clients.md ("Request fields") says
what each does here. `cache_control` is accepted and ignored: rank 0's prefix cache reuses a
repeated prompt prefix on its own.
"""

from __future__ import annotations

from typing import Any

import msgspec

from contract.openai_errors import ApiError, ErrorEnvelope, error_kind

MESSAGES_PATH = "/v1/messages"
PROMPT_ROLES = ("user", "assistant", "system")


class CacheControl(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    ttl: str | None = None


class TextBlock(
    msgspec.Struct, tag="text", tag_field="type", omit_defaults=True, forbid_unknown_fields=True
):
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None  # sent back as received; none made here


class ToolUseBlock(
    msgspec.Struct, tag="tool_use", tag_field="type", omit_defaults=True,
    forbid_unknown_fields=True,
):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolReferenceBlock(
    msgspec.Struct, tag="tool_reference", tag_field="type", omit_defaults=True,
    forbid_unknown_fields=True,
):
    """In a tool_result (a client's tool search): loads a deferred tool into the prompt."""

    tool_name: str
    cache_control: CacheControl | None = None


class ToolResultBlock(
    msgspec.Struct, tag="tool_result", tag_field="type", omit_defaults=True,
    forbid_unknown_fields=True,
):
    tool_use_id: str
    content: str | list[TextBlock | ToolReferenceBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(
    msgspec.Struct, tag="thinking", tag_field="type", omit_defaults=True,
    forbid_unknown_fields=True,
):
    """The model's reasoning; `signature` (serving/api/thinking_signature.py) lets a client
    send it back in a later turn, and proves it came from this cluster."""

    thinking: str
    signature: str
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(
    msgspec.Struct, tag="redacted_thinking", tag_field="type", omit_defaults=True,
    forbid_unknown_fields=True,
):
    data: str  # never made here; one sent back is checked like a signature
    cache_control: CacheControl | None = None


InputBlock = (
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
OutputBlock = TextBlock | ToolUseBlock | ThinkingBlock


class InputMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: str  # "user" | "assistant" | "system" (Claude Code's mid-conversation system turn)
    content: str | list[InputBlock]


class ToolDefinition(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None  # "custom" or absent; Anthropic's server tools are refused
    cache_control: CacheControl | None = None
    # Left out of the prompt until a tool_reference names it (serving/api/messages_prompt.py).
    defer_loading: bool | None = None
    input_examples: list[dict[str, Any]] | None = None  # no effect: the template shows none


class ToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str  # "auto" | "any" | "tool" | "none"
    name: str | None = None  # with "tool"
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(msgspec.Struct, forbid_unknown_fields=True):
    type: str  # "enabled" | "adaptive" | "disabled"
    budget_tokens: int | None = None  # with "enabled": a ceiling on the reasoning's tokens
    display: str | None = None  # "summarized" (the default) | "omitted": empty thinking text


class JsonOutputFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: str  # "json_schema"
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, forbid_unknown_fields=True):
    effort: str | None = None  # "low" | "medium" | "high" | "xhigh" | "max"
    format: JsonOutputFormat | None = None  # structured output: constrained decoding


class ContextEdit(msgspec.Struct, forbid_unknown_fields=True):
    """One context_management edit; only clear_thinking_* is honoured (messages_prompt.py).
    `keep`: "all", {"type": "all"} or {"type": "thinking_turns", "value": N}."""

    type: str
    keep: str | dict[str, Any] | None = None


class ContextManagement(msgspec.Struct, forbid_unknown_fields=True):
    edits: list[ContextEdit] | None = None


class PromptFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What makes the prompt: shared by /v1/messages and /v1/messages/count_tokens."""

    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    cache_control: CacheControl | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None


class MessagesRequest(PromptFields, kw_only=True, forbid_unknown_fields=True):
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    # Metadata and routing with no effect on the output here: accepted and ignored
    # (docs/clients.md, "Request fields").
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    speed: str | None = None  # "standard" | "fast": one speed here
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    container: str | dict[str, Any] | None = None
    user_profile_id: str | None = None


class CountTokensRequest(PromptFields, kw_only=True, forbid_unknown_fields=True):
    pass


class TokenCount(msgspec.Struct):
    input_tokens: int


class MessageUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int


class Message(msgspec.Struct):
    id: str
    model: str
    content: list[OutputBlock]
    stop_reason: str | None  # "end_turn" | "max_tokens" | "stop_sequence" | "tool_use"
    stop_sequence: str | None
    usage: MessageUsage
    type: str = "message"
    role: str = "assistant"


# The stream: `event: <type>` and `data: <one of these>` per event.
class MessageStart(msgspec.Struct, tag="message_start", tag_field="type"):
    message: Message


class ContentBlockStart(msgspec.Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: OutputBlock


class TextDelta(msgspec.Struct, tag="text_delta", tag_field="type"):
    text: str


class ThinkingDelta(msgspec.Struct, tag="thinking_delta", tag_field="type"):
    thinking: str


class SignatureDelta(msgspec.Struct, tag="signature_delta", tag_field="type"):
    signature: str


class InputJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class ContentBlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta


class ContentBlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type"):
    index: int


class StopInfo(msgspec.Struct):
    stop_reason: str
    stop_sequence: str | None = None


class DeltaUsage(msgspec.Struct):
    output_tokens: int


class MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type"):
    delta: StopInfo
    usage: DeltaUsage


class MessageStop(msgspec.Struct, tag="message_stop", tag_field="type"):
    pass


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorEnvelope(msgspec.Struct, tag="error", tag_field="type"):
    error: AnthropicErrorBody


StreamEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta
    | MessageStop | AnthropicErrorEnvelope
)


def anthropic_error(exc: ApiError) -> AnthropicErrorEnvelope:
    """The error in Anthropic's shape; the field at fault leads the message."""
    body = exc.body
    message = body.message
    if body.param and not message.startswith(body.param):
        message = f"{body.param}: {message}"
    return AnthropicErrorEnvelope(AnthropicErrorBody(error_kind(exc.status).anthropic, message))


def anthropic_event(payload: Any) -> bytes:
    """One server-sent event, named by its payload's `type` as Anthropic's stream does."""
    tag = type(payload).__struct_config__.tag
    return b"event: " + str(tag).encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


def error_payload(exc: ApiError, path: str) -> object:
    """The body of an error answer: Anthropic's shape on its routes, else OpenAI's."""
    return anthropic_error(exc) if path.startswith(MESSAGES_PATH) else ErrorEnvelope(exc.body)
