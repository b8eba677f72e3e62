"""POST /v1/responses: OpenAI's Responses API on the engine, whole or streamed.

A translation onto the chat machinery: the prompt through the chat template
(responses_prompt.py), tools through the same plan and parsers as chat completions
(responses_tools.py, tool_calls.py), the output items and stream events in
responses_events.py. Stateless: nothing is stored (see responses_prompt.check_request).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from contract.responses_schemas import ReasoningConfig, ResponsesRequest
from contract.responses_schemas import Response as ResponseBody
from serving.api.chat import render_prompt
from serving.api.generation import Admitted, admit, failure_error, ready
from serving.api.reasoning import REASONING, Part, ReasoningSplitter
from serving.api.responses_events import ResponseBuild
from serving.api.responses_prompt import (
    check_request,
    max_tokens,
    sampling_params,
    seal_reasoning,
    template_kwargs,
    template_messages,
    wants_encrypted_reasoning,
)
from serving.api.responses_tools import tool_plan, tool_set
from serving.api.state import ServingState
from serving.api.tool_calls import ToolCallStream
from serving.api.validation import decode_body
from serving.engine import requests as engine
from serving.engine.requests import Finished


def token_count(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def created(req: ResponsesRequest, response_id: str, created_at: int) -> ResponseBody:
    """The response as it starts: in progress, no output, the request's settings echoed."""
    return ResponseBody(
        id=response_id, created_at=created_at, model=req.model, status="in_progress",
        output=[], tools=req.tools or [], tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        reasoning=req.reasoning or ReasoningConfig(), temperature=req.temperature,
        top_p=req.top_p, text=req.text, truncation=req.truncation or "disabled",
        metadata=req.metadata or {}, prompt_cache_key=req.prompt_cache_key,
    )


@dataclass
class Answer:
    """The generated text through the reasoning splitter, then the tool-call parser (calls
    are parsed out of the content only), into the response's build."""

    build: ResponseBuild
    splitter: ReasoningSplitter
    calls: ToolCallStream

    def feed(self, text: str) -> list[bytes]:
        return self._parts(self.splitter.feed(text))

    def finish(self, done: Finished) -> list[bytes]:
        out = self._parts(self.splitter.finish())
        return [*out, *self.build.add(*self.calls.finish()), *self.build.finish(done)]

    def _parts(self, parts: list[Part]) -> list[bytes]:
        out: list[bytes] = []
        for part in parts:
            if part.kind == REASONING:
                out += self.build.reason(part.text)
            else:
                out += self.build.add(*self.calls.feed(part.text))
        return out

    async def whole(self, admitted: Admitted, request: Request) -> ResponseBody:
        got = await admitted.collect(request)
        self.feed(got.text)
        self.finish(got.finished)
        return self.build.final(got.finished)

    async def stream(self, admitted: Admitted) -> AsyncIterator[bytes]:
        for chunk in self.build.start():
            yield chunk
        async for event in admitted.events():
            if isinstance(event, engine.TextDelta):
                chunks = self.feed(event.text)
            elif isinstance(event, Finished):
                chunks = self.finish(event)
            else:
                error = failure_error(event)
                chunks = self.build.fail(error.body.code or error.body.type, error.body.message)
            for chunk in chunks:
                yield chunk


class ResponsesController(Controller):
    path = "/v1/responses"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[ResponseBody] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), ResponsesRequest)
        check_request(req, serving.model_ids)
        engine, model = ready(serving)
        tools = tool_set(req.tools)
        plan = tool_plan(req, tools, model.tokenizer)
        messages = template_messages(req, serving.thinking_key)
        prompt = await serving.prompts.run(
            engine, render_prompt, model.tokenizer, messages, plan, template_kwargs(req))
        cap = max_tokens(req, len(prompt), model, serving.settings.serving.max_tokens_limit)
        admitted = admit(serving, prompt, sampling_params(req, model, cap), [], param="input")
        seal = partial(seal_reasoning, serving.thinking_key)
        answer = Answer(
            ResponseBuild(created(req, f"resp_{admitted.request_id}", admitted.created),
                          tools.item, new_id, seal if wants_encrypted_reasoning(req) else None,
                          count=lambda text: token_count(model.tokenizer, text)),
            ReasoningSplitter.for_prompt(model.tokenizer, prompt),
            ToolCallStream(model.tokenizer, plan),
        )
        if not req.stream:
            return Response(await answer.whole(admitted, request))
        await admitted.started(request)
        return Stream(answer.stream(admitted), media_type="text/event-stream")
