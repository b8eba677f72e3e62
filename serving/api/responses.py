"""POST /v1/responses: OpenAI's Responses API on the engine, whole or streamed.

A translation onto the chat machinery: the prompt through the chat template
(responses_prompt.py), tools through the same plan and parsers as chat completions
(responses_tools.py, tool_calls.py), the output items and stream events in
responses_events.py. Stateless: nothing is stored (see responses_prompt.check_request).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from contract.responses_schemas import ReasoningConfig, ResponsesRequest
from contract.responses_schemas import Response as ResponseBody
from serving.api.chat import render_prompt
from serving.api.generation import Admitted, admit, failure_error, ready
from serving.api.responses_events import ResponseBuild
from serving.api.responses_prompt import (
    check_request,
    max_tokens,
    sampling_params,
    template_messages,
)
from serving.api.responses_tools import tool_plan, tool_set
from serving.api.state import ServingState
from serving.api.tool_calls import ToolCallStream
from serving.api.validation import decode_body
from serving.engine import requests as engine
from serving.engine.requests import Finished


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


async def whole(build: ResponseBuild, calls: ToolCallStream, admitted: Admitted,
                request: Request) -> ResponseBody:
    got = await admitted.collect(request)
    build.add(*calls.feed(got.text))
    build.add(*calls.finish())
    build.finish(got.finished)
    return build.final(got.finished)


async def stream(build: ResponseBuild, calls: ToolCallStream,
                 admitted: Admitted) -> AsyncIterator[bytes]:
    for chunk in build.start():
        yield chunk
    async for event in admitted.events():
        if isinstance(event, engine.TextDelta):
            chunks = build.add(*calls.feed(event.text))
        elif isinstance(event, Finished):
            chunks = build.add(*calls.finish()) + build.finish(event)
        else:
            error = failure_error(event)
            chunks = build.fail(error.body.code or "server_error", error.body.message)
        for chunk in chunks:
            yield chunk


class ResponsesController(Controller):
    path = "/v1/responses"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[ResponseBody] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), ResponsesRequest)
        check_request(req, serving.model_id)
        _, model = ready(serving)
        tools = tool_set(req.tools)
        plan = tool_plan(req, tools, model.tokenizer)
        prompt = render_prompt(model.tokenizer, template_messages(req), plan)
        cap = max_tokens(req, len(prompt), model, serving.settings.serving.max_tokens_limit)
        admitted = admit(serving, prompt, sampling_params(req, model, cap), [], param="input")
        body = created(req, f"resp_{admitted.request_id}", admitted.created)
        build = ResponseBuild(body, tools.item, new_id)
        calls = ToolCallStream(model.tokenizer, plan)
        if not req.stream:
            return Response(await whole(build, calls, admitted, request))
        await admitted.started(request)
        return Stream(stream(build, calls, admitted), media_type="text/event-stream")
