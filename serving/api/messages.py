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
    PromptFields,
    SignatureDelta,
    StopInfo,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
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
from serving.api.messages_thinking import ThinkingPlan, template_kwargs, turn_reasoning
from serving.api.reasoning import CONTENT, Part, ReasoningSplitter
from serving.api.state import ServingState
from serving.api.thinking_signature import sign
from serving.api.tool_calls import ToolCallStream, ToolPlan
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
    """Formats one request's events as one Message or as Anthropic's event stream: the
    reasoning (split off first) as thinking blocks, signed; calls parsed from the rest."""

    message_id: str
    model_id: str
    calls: ToolCallStream
    prompt_tokens: int
    reasoning: ReasoningSplitter
    signer: Signer

    def message(self, content: list[OutputBlock], stop: StopInfo | None,
                output_tokens: int) -> Message:
        usage = MessageUsage(self.prompt_tokens, output_tokens)
        reason, sequence = (stop.stop_reason, stop.stop_sequence) if stop else (None, None)
        return Message(self.message_id, self.model_id, content, reason, sequence, usage)

    def whole(self, got: Collected) -> Message:
        parts = [*self.reasoning.feed(got.text), *self.reasoning.finish()]
        content, made = self.calls.feed("".join(p.text for p in parts if p.kind == CONTENT))
        rest, more = self.calls.finish()
        text, made = content + rest, made + more
        thought = self.reasoning.reasoning
        blocks: list[OutputBlock] = [self.signer.block(thought)] if thought else []
        blocks += [TextBlock(text)] if text else []
        blocks += [tool_use(call) for call in made]
        stop = stop_reason(got.finished, self.calls.calls)
        return self.message(blocks, stop, got.finished.completion_tokens)

    async def stream(self, admitted: Admitted) -> AsyncIterator[bytes]:
        """message_start, a content block per text run or call, message_delta with the
        stop reason and usage, message_stop; a failure mid-way is an `error` event."""
        yield anthropic_event(MessageStart(self.message(content=[], stop=None, output_tokens=0)))
        blocks = _Blocks(self.signer)
        async for event in admitted.events():
            if isinstance(event, engine.TextDelta):
                for chunk in self._parts(blocks, self.reasoning.feed(event.text)):
                    yield chunk
            elif isinstance(event, Finished):
                ending = self._parts(blocks, self.reasoning.finish())
                for chunk in [*ending, *blocks.add(*self.calls.finish()), *blocks.close()]:
                    yield chunk
                stop = stop_reason(event, self.calls.calls)
                yield anthropic_event(MessageDelta(stop, DeltaUsage(event.completion_tokens)))
                yield anthropic_event(MessageStop())
            else:
                yield anthropic_event(anthropic_error(failure_error(event)))

    def _parts(self, blocks: _Blocks, parts: list[Part]) -> list[bytes]:
        out: list[bytes] = []
        for part in parts:
            if part.kind == CONTENT:
                out += blocks.add(*self.calls.feed(part.text))
            else:
                out += blocks.think(part.text)
        return out


class _Blocks:
    """Numbers the content blocks of a stream: a reasoning run opens a thinking block
    (thinking_delta events, then its signature_delta), text runs open a text block, each
    call is a tool_use block whose input arrives as one input_json_delta."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.count = 0
        self.text_open = False
        self.thought: str | None = None  # the open thinking block's text

    def think(self, text: str) -> list[bytes]:
        out = self.close() if self.text_open else []
        if self.thought is None:
            self.thought = ""
            out.append(anthropic_event(ContentBlockStart(self.count, ThinkingBlock("", ""))))
        self.thought += text
        if not self.signer.omitted:
            out.append(anthropic_event(ContentBlockDelta(self.count, ThinkingDelta(text))))
        return out

    def add(self, text: str, calls: list[ToolCall]) -> list[bytes]:
        out: list[bytes] = self.close() if self.thought is not None and (text or calls) else []
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
        """Ends the open thinking block (with its signature) or text block, if any."""
        out: list[bytes] = []
        if self.thought is not None:
            signature = SignatureDelta(self.signer.block(self.thought).signature)
            out.append(anthropic_event(ContentBlockDelta(self.count, signature)))
            self.thought = None
        elif not self.text_open:
            return []
        self.text_open = False
        self.count += 1
        return [*out, anthropic_event(ContentBlockStop(self.count - 1))]


class MessagesController(Controller):
    path = "/v1/messages"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[Message] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), MessagesRequest)
        thinking = check_request(req, serving.model_ids)
        engine, model = ready(serving)
        tools = tool_plan(req, model.tokenizer)
        prompt = await serving.prompts.run(engine, _prompt, req, thinking, serving, tools)
        cap = max_tokens(req, len(prompt), model, serving.settings.serving.max_tokens_limit)
        params = sampling_params(req, model, cap, thinking.budget, prompt)
        admitted = admit(serving, prompt, params, req.stop_sequences or [])
        answer = MessageAnswer(
            f"msg_{admitted.request_id}", serving.model_id,
            ToolCallStream(model.tokenizer, tools), admitted.prompt_tokens,
            ReasoningSplitter.for_prompt(model.tokenizer, prompt),
            Signer(serving.thinking_key, thinking.omitted),
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
        thinking = check_prompt_fields(req, serving.model_ids)
        engine, model = ready(serving)
        tools = tool_plan(req, model.tokenizer)
        prompt = await serving.prompts.run(engine, _prompt, req, thinking, serving, tools)
        return TokenCount(len(prompt))


def _prompt(req: PromptFields, thinking: ThinkingPlan, serving: ServingState,
            tools: ToolPlan) -> list[int]:
    """The chat template's tokens, with the thinking switch and the kept turns' thinking
    (every thinking block sent back checked first)."""
    assert serving.model is not None  # ready() was checked
    reasoning = turn_reasoning(serving.thinking_key, req.messages, thinking.keep_turns)
    return render_prompt(serving.model.tokenizer, template_messages(req, reasoning), tools,
                         template_kwargs(thinking))


@dataclass(frozen=True)
class Signer:
    """Signs a thinking block with the cluster's key; `omitted` (display "omitted") sends
    its text empty, carried in the signature instead."""

    key: bytes
    omitted: bool

    def block(self, thought: str) -> ThinkingBlock:
        signature = sign(self.key, thought, carry_text=self.omitted)
        return ThinkingBlock("" if self.omitted else thought, signature)
