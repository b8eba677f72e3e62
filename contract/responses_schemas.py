"""OpenAI's Responses API (`POST /v1/responses`): request, response and stream event bodies.

Rank 0 decodes and encodes with them (serving/api/responses*.py); the gateway publishes them
in its OpenAPI document and forwards the bytes. The request refuses unknown top-level
fields, as the other APIs do. `input` items and `tools` stay loose JSON objects here: each
kind has its own fields (and clients such as Codex CLI send kinds this server only lists),
so rank 0 reads each by its `type` and names the item at fault (`input.3.call_id`).
The stream is `event: <type>` and `data: <event>` per event, each event with its
`sequence_number`, as OpenAI's own; no `[DONE]`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from contract.openai_errors import ApiError

RESPONSES_PATH = "/v1/responses"


class ReasoningConfig(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    effort: str | None = None  # "none" | "minimal" | "low" | "medium" | "high" | "xhigh"
    summary: str | None = None  # "auto" | "concise" | "detailed": no summaries made here
    generate_summary: str | None = None  # the older name of summary


class TextConfig(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_schema" | "json_object"}
    verbosity: str | None = None  # "low" | "medium" | "high": no effect here


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_obfuscation: bool | None = None  # no obfuscation padding is added here


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    text: TextConfig | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    include: list[str] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    truncation: str | None = None  # "auto" | "disabled"
    # Accepted with no effect on the output (see docs/clients.md, "Responses API").
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    client_metadata: dict[str, Any] | None = None  # Codex CLI's
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None  # counts built-in tools' calls: none run here


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    logprobs: list[dict[str, Any]] = msgspec.field(default_factory=list)


class OutputMessage(msgspec.Struct, tag="message", tag_field="type"):
    id: str
    status: str  # "in_progress" | "completed" | "incomplete"
    content: list[OutputText]
    role: str = "assistant"


class FunctionCallItem(msgspec.Struct, tag="function_call", tag_field="type"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"
    namespace: str | None = None  # the namespace tool the function belongs to


class CustomToolCallItem(msgspec.Struct, tag="custom_tool_call", tag_field="type"):
    id: str
    call_id: str
    name: str
    input: str
    status: str = "completed"


class ReasoningText(msgspec.Struct, tag="reasoning_text", tag_field="type"):
    text: str


class SummaryText(msgspec.Struct, tag="summary_text", tag_field="type"):
    text: str


class ReasoningItem(msgspec.Struct, tag="reasoning", tag_field="type"):
    id: str
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None  # with include ["reasoning.encrypted_content"]
    status: str | None = None


OutputItem = OutputMessage | FunctionCallItem | CustomToolCallItem | ReasoningItem


class InputTokensDetails(msgspec.Struct):
    # Not counted by the engine yet: its prefix cache reuses a prompt's prefix on its own.
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = msgspec.field(
        default_factory=OutputTokensDetails
    )


class IncompleteDetails(msgspec.Struct):
    reason: str  # "max_output_tokens"


class ResponseError(msgspec.Struct):
    code: str
    message: str


class Response(msgspec.Struct, kw_only=True):
    id: str
    created_at: int
    model: str
    status: str  # "in_progress" | "completed" | "incomplete" | "failed"
    output: list[OutputItem]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    object: str = "response"
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = False  # nothing is stored here, whatever the request said
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    prompt_cache_key: str | None = None
    service_tier: str = "default"


# The stream's events. Each `type` lists its names, so that an event matches one schema of
# the union in the OpenAPI document (without them, optional fields let one event match two).
LifecycleType = Literal["response.created", "response.in_progress", "response.completed",
                        "response.incomplete", "response.failed"]


class Lifecycle(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """response.created / in_progress / completed / incomplete / failed."""

    type: LifecycleType
    sequence_number: int = 0  # set as the stream sends it
    response: Response


class OutputItemEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """response.output_item.added / .done."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int = 0  # set as the stream sends it
    output_index: int
    item: OutputItem


class ContentPartEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """response.content_part.added / .done."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int = 0  # set as the stream sends it
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class TextDeltaEvent(msgspec.Struct, kw_only=True, omit_defaults=True,
                     forbid_unknown_fields=True):
    """response.output_text.delta, response.reasoning_text.delta."""

    type: Literal["response.output_text.delta", "response.reasoning_text.delta"]
    sequence_number: int = 0  # set as the stream sends it
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[dict[str, Any]] | None = None  # output_text's only


class TextDoneEvent(msgspec.Struct, kw_only=True, omit_defaults=True,
                     forbid_unknown_fields=True):
    """response.output_text.done, response.reasoning_text.done."""

    type: Literal["response.output_text.done", "response.reasoning_text.done"]
    sequence_number: int = 0  # set as the stream sends it
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[dict[str, Any]] | None = None


class ArgumentsDeltaEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """response.function_call_arguments.delta, response.custom_tool_call_input.delta."""

    type: Literal["response.function_call_arguments.delta",
                  "response.custom_tool_call_input.delta"]
    sequence_number: int = 0  # set as the stream sends it
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(msgspec.Struct, kw_only=True, omit_defaults=True,
                     forbid_unknown_fields=True):
    """response.function_call_arguments.done (arguments, name), custom_tool_call_input.done
    (input)."""

    type: Literal["response.function_call_arguments.done",
                  "response.custom_tool_call_input.done"]
    sequence_number: int = 0  # set as the stream sends it
    item_id: str
    output_index: int
    arguments: str | None = None
    name: str | None = None
    input: str | None = None


class ErrorEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`error`: a stream that cannot go on (the gateway lost the gang mid-way)."""

    type: Literal["error"] = "error"
    code: str | None = None
    message: str
    param: str | None = None
    sequence_number: int = 0


StreamEvent = (
    Lifecycle | OutputItemEvent | ContentPartEvent | TextDeltaEvent | TextDoneEvent
    | ArgumentsDeltaEvent | ArgumentsDoneEvent | ErrorEvent
)


def responses_event(payload: Any) -> bytes:
    """One server-sent event named by its payload's `type`, as OpenAI's stream has it."""
    name = payload.type.encode()
    return b"event: " + name + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


def error_event(exc: ApiError, sequence_number: int = 0) -> bytes:
    body = exc.body
    return responses_event(ErrorEvent(code=body.code, message=body.message, param=body.param,
                                      sequence_number=sequence_number))
