"""POST /v1/chat/completions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from contract.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    Delta,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from serving.api.admission import admit_openai
from serving.api.chat_reasoning import template_kwargs
from serving.api.errors import invalid
from serving.api.generation import Collected
from serving.api.logprobs import chat_logprobs as logprobs_body
from serving.api.reasoning import CONTENT, Part, ReasoningSplitter
from serving.api.sse import stream_events, usage_of
from serving.api.state import ServingState
from serving.api.timings import timings_of
from serving.api.tool_calls import ToolCallStream, ToolPlan, plan_tools
from serving.api.validation import chat_messages
from serving.engine.requests import Finished, TextDelta, TokenLogprob


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: ToolPlan,
                  template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The chat template's tokens; a call that must be made starts in the prompt.
    `template_kwargs`: the template's own switches (`enable_thinking` ...)."""
    try:
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools.tools, add_generation_prompt=True, **(template_kwargs or {})
        )
    except Exception as exc:  # jinja2 raises its own errors (raise_exception in templates)
        raise invalid(f"The chat template refused these messages: {exc}", "messages") from exc
    if tools.open_call:
        prompt += tokenizer.encode(tokenizer.tool_call_start, add_special_tokens=False)
    return list(prompt)


@dataclass
class ChatPrompt:
    """Renders a chat request's prompt, keeping the tool plan the answer is parsed with."""

    tools: ToolPlan = field(default_factory=lambda: ToolPlan(None))
    tokens: list[int] = field(default_factory=list)

    def __call__(self, req: ChatCompletionRequest, tokenizer: Any) -> list[int]:
        self.tools = plan_tools(req, tokenizer)
        self.tokens = render_prompt(tokenizer, chat_messages(req), self.tools,
                                    template_kwargs(req))
        return self.tokens


def finish_reason(done: Finished, calls: list[ToolCall]) -> str:
    return "tool_calls" if calls and done.finish_reason == "stop" else done.finish_reason


@dataclass
class ChatAnswer:
    """Formats one request's events as chat chunks or one completion (ids, logprobs, calls)."""

    rid: str
    created: int
    model_id: str
    tokenizer: Any
    top: int | None  # logprobs asked for: top tokens per token; None for none
    calls: ToolCallStream
    reasoning: ReasoningSplitter  # runs first: calls are parsed from the content only
    pending: list[TokenLogprob] = field(default_factory=list)  # of text not sent yet

    def logprobs(self, items: list[TokenLogprob]) -> ChatLogprobs | None:
        return None if self.top is None else logprobs_body(items, self.tokenizer)

    def chunk(self, delta: Delta, finish: str | None = None,
              lp: ChatLogprobs | None = None) -> ChatCompletionChunk:
        choice = ChatChunkChoice(0, delta, finish, lp)
        return ChatCompletionChunk(self.rid, self.created, self.model_id, [choice])

    def first(self) -> ChatCompletionChunk:
        return self.chunk(Delta(role="assistant", content=""))

    def delta(self, event: TextDelta) -> list[object]:
        self.pending.extend(event.logprobs)
        return self._parts(self.reasoning.feed(event.text))

    def final(self, done: Finished) -> list[object]:
        ending = self.chunk(Delta(), finish_reason(done, self.calls.calls))
        rest = self._parts(self.reasoning.finish())
        return [*rest, *self._pieces(*self.calls.finish()), ending]

    def _parts(self, parts: list[Part]) -> list[object]:
        out: list[object] = []
        for part in parts:
            if part.kind == CONTENT:
                out += self._pieces(*self.calls.feed(part.text))
            else:
                out.append(self.chunk(Delta(reasoning_content=part.text)))
        return out

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.rid, self.created, self.model_id, [], usage)

    def _pieces(self, content: str, made: list[ToolCall]) -> list[object]:
        out: list[object] = []
        if content:
            out.append(self.chunk(Delta(content=content), lp=self.logprobs(self.pending)))
            self.pending = []
        if made:
            first = len(self.calls.calls) - len(made)
            deltas = [
                ToolCallDelta(first + i, c.id, FunctionCallDelta(c.function.name,
                                                                 c.function.arguments))
                for i, c in enumerate(made)
            ]
            out.append(self.chunk(Delta(tool_calls=deltas)))
        return out

    def whole(self, got: Collected) -> ChatCompletion:
        parts = [*self.reasoning.feed(got.text), *self.reasoning.finish()]
        content, made = self.calls.feed("".join(p.text for p in parts if p.kind == CONTENT))
        rest, more = self.calls.finish()
        content, made = content + rest, made + more
        message = AssistantMessage(
            "assistant", content if content or not made else None, made or None,
            self.reasoning.reasoning or None,
        )
        reason = finish_reason(got.finished, made)
        choice = ChatChoice(0, message, reason, self.logprobs(got.logprobs))
        return ChatCompletion(
            self.rid, self.created, self.model_id, [choice], usage_of(got.finished)
        )


class ChatController(Controller):
    path = "/v1/chat/completions"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[ChatCompletion] | Stream:
        serving: ServingState = state.serving
        prompt = ChatPrompt()
        got = await admit_openai(request, serving, ChatCompletionRequest, prompt)
        req, admitted, tokenizer = got.req, got.admitted, got.model.tokenizer
        answer = ChatAnswer(
            f"chatcmpl-{admitted.request_id}", admitted.created, serving.model_id,
            tokenizer, got.top, ToolCallStream(tokenizer, prompt.tools),
            ReasoningSplitter.for_prompt(tokenizer, prompt.tokens),
        )
        if not req.stream:
            whole = await admitted.collect(request)
            body = answer.whole(whole)
            if req.timings_per_token:
                body.timings = timings_of(whole.finished)
            return Response(body)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = stream_events(
            admitted,
            first=answer.first,
            delta=answer.delta,
            final=answer.final,
            usage=answer.usage if include_usage else None,
            timed=bool(req.timings_per_token),
        )
        return Stream(events, media_type="text/event-stream")
