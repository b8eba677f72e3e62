"""The OpenAI API's request and response bodies, as msgspec Structs.

Rank 0 decodes requests and encodes responses with them (serving/api/); the gateway
publishes them in its OpenAPI document (orchestrator/gateway/openapi.py) but forwards the
bytes untouched. Request bodies refuse unknown fields (a typo or a feature this server
lacks is a 400 naming the field, never silently ignored). Fields OpenAI clients send with
neutral values (`n: 1`, `echo: false`, ...) are declared so those values pass;
serving/api/validation.py refuses the values this server does not honour.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    # An assistant turn's reasoning sent back (vLLM's and DeepSeek's name): the template
    # decides whether earlier turns' reasoning is shown.
    reasoning_content: str | None = None


class FunctionDefinition(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: FunctionDefinition


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: NamedFunction


class SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields chat and text completions share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    # Metadata with no effect on the output: accepted and ignored.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    # Logits processors and filters, applied alike on every rank.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = None
    logprobs: bool | int | None = None  # chat: a bool; completions: how many top tokens
    top_logprobs: int | None = None  # chat only
    # Accepted only as {"type": "text"} (validation.py).
    response_format: dict[str, Any] | None = None
    # llama.cpp server's name: true adds `timings` to the answer (its final chunk when
    # streamed). Off by default, so an answer is OpenAI's shape only.
    timings_per_token: bool | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Reasoning (serving/api/chat_reasoning.py): "none" / "minimal" turn the template's
    # thinking switch off, "low" / "medium" / "high" on.
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # the template's own switches


class CompletionRequest(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    prompt: str | list[str | int]  # text, [text] or token ids
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(msgspec.Struct):
    """How long the prompt and the generation took, in llama.cpp server's shape."""

    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # the reasoning, kept apart (absent: none)


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob]


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    timings: Timings | UnsetType = UNSET  # absent unless asked for (timings_per_token)


class FunctionCallDelta(msgspec.Struct):
    name: str
    arguments: str


class ToolCallDelta(msgspec.Struct):
    """A whole call in one chunk (OpenAI may split `arguments` over several)."""

    index: int
    id: str
    function: FunctionCallDelta
    type: str = "function"


class Delta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"
    timings: Timings | UnsetType = UNSET


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class TextChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    object: str = "text_completion"
    timings: Timings | UnsetType = UNSET


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "mlx-cluster-orchestrator"
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
