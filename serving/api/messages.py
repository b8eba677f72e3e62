"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from contract.anthropic_schemas import (
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    CountTokensRequest,
    DeltaUsage,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessagesRequest,
    MessageStart,
    MessageStop,
    MessageUsage,
    OutputBlock,
    StopInfo,
    TextBlock,
    TextDelta,
    TokenCount,
    ToolUseBlock,
    anthropic_error,
    anthropic_event,
)
from contract.openai_schemas import ToolCall
from serving.api.chat import render_prompt
from serving.api.generation import Admitted, Collected, admit, failure_error, ready
from serving.api.messages_prompt import (
    check_prompt_fields,
    check_request,
    max_tokens,
    sampling_params,
    template_messages,
    tool_plan,
)
from serving.api.state import ServingState
from serving.api.tool_calls import ToolCallStream
from serving.api.validation import decode_body
from serving.engine import requests as engine
from serving.engine.requests import Finished


def stop_reason(done: Finished, calls: list[ToolCall]) -> StopInfo:
    if done.finish_reason == "length":
        return StopInfo("max_tokens")
    if calls:
        return StopInfo("tool_use")
    if done.stop_sequence is not None:
        return StopInfo("stop_sequence", done.stop_sequence)
    return StopInfo("end_turn")


def tool_use(call: ToolCall) -> ToolUseBlock:
    """A parsed call as a tool_use block: Anthropic's ids, arguments as an object."""
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    return ToolUseBlock(
        "toolu_" + call.id.removeprefix("call_"), call.function.name,
        arguments if isinstance(arguments, dict) else {"arguments": arguments},
    )


@dataclass
class MessageAnswer:
    """Formats one request's events as one Message or as Anthropic's event stream."""

    message_id: str
    model_id: str
    calls: ToolCallStream
    prompt_tokens: int

    def message(self, content: list[OutputBlock], stop: StopInfo | None,
                output_tokens: int) -> Message:
        usage = MessageUsage(self.prompt_tokens, output_tokens)
        reason, sequence = (stop.stop_reason, stop.stop_sequence) if stop else (None, None)
        return Message(self.message_id, self.model_id, content, reason, sequence, usage)

    def whole(self, got: Collected) -> Message:
        content, made = self.calls.feed(got.text)
        rest, more = self.calls.finish()
        text, made = content + rest, made + more
        blocks: list[OutputBlock] = [TextBlock(text)] if text else []
        blocks += [tool_use(call) for call in made]
        stop = stop_reason(got.finished, self.calls.calls)
        return self.message(blocks, stop, got.finished.completion_tokens)

    async def stream(self, admitted: Admitted) -> AsyncIterator[bytes]:
        """message_start, a content block per text run or call, message_delta with the
        stop reason and usage, message_stop; a failure mid-way is an `error` event."""
        yield anthropic_event(MessageStart(self.message(content=[], stop=None, output_tokens=0)))
        blocks = _Blocks()
        async for event in admitted.events():
            if isinstance(event, engine.TextDelta):
                for chunk in blocks.add(*self.calls.feed(event.text)):
                    yield chunk
            elif isinstance(event, Finished):
                for chunk in [*blocks.add(*self.calls.finish()), *blocks.close()]:
                    yield chunk
                stop = stop_reason(event, self.calls.calls)
                yield anthropic_event(MessageDelta(stop, DeltaUsage(event.completion_tokens)))
                yield anthropic_event(MessageStop())
            else:
                yield anthropic_event(anthropic_error(failure_error(event)))


class _Blocks:
    """Numbers the content blocks of a stream: text runs open a text block, each call is
    a tool_use block whose input arrives as one input_json_delta."""

    def __init__(self) -> None:
        self.count = 0
        self.text_open = False

    def add(self, text: str, calls: list[ToolCall]) -> list[bytes]:
        out: list[bytes] = []
        if text:
            if not self.text_open:
                out.append(anthropic_event(ContentBlockStart(self.count, TextBlock(""))))
                self.text_open = True
            out.append(anthropic_event(ContentBlockDelta(self.count, TextDelta(text))))
        for call in calls:
            out += self.close()
            block = tool_use(call)
            start = ToolUseBlock(block.id, block.name, {})
            partial = InputJsonDelta(json.dumps(block.input, ensure_ascii=False))
            out += [
                anthropic_event(ContentBlockStart(self.count, start)),
                anthropic_event(ContentBlockDelta(self.count, partial)),
                anthropic_event(ContentBlockStop(self.count)),
            ]
            self.count += 1
        return out

    def close(self) -> list[bytes]:
        """Ends the open text block, if any."""
        if not self.text_open:
            return []
        self.text_open = False
        self.count += 1
        return [anthropic_event(ContentBlockStop(self.count - 1))]


class MessagesController(Controller):
    path = "/v1/messages"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[Message] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), MessagesRequest)
        check_request(req, serving.model_id)
        _, model = ready(serving)
        tools = tool_plan(req, model.tokenizer)
        prompt = render_prompt(model.tokenizer, template_messages(req), tools)
        cap = max_tokens(req, len(prompt), model, serving.settings.serving.max_tokens_limit)
        params = sampling_params(req, model, cap)
        admitted = admit(serving, prompt, params, req.stop_sequences or [])
        answer = MessageAnswer(
            f"msg_{admitted.request_id}", serving.model_id,
            ToolCallStream(model.tokenizer, tools), admitted.prompt_tokens,
        )
        if not req.stream:
            return Response(answer.whole(await admitted.collect(request)))
        await admitted.started(request)
        return Stream(answer.stream(admitted), media_type="text/event-stream")

    @post("/count_tokens", status_code=200)
    async def count_tokens(self, request: Request, state: State) -> TokenCount:
        """The prompt's tokens as the chat template renders it, tools included."""
        serving: ServingState = state.serving
        req = decode_body(await request.body(), CountTokensRequest)
        check_prompt_fields(req, serving.model_id)
        _, model = ready(serving)
        tools = tool_plan(req, model.tokenizer)
        return TokenCount(len(render_prompt(model.tokenizer, template_messages(req), tools)))
