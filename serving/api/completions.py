"""POST /v1/completions."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from serving.api.errors import invalid
from serving.api.generation import admit, ready
from serving.api.schemas import Completion, CompletionRequest, TextChoice, Usage
from serving.api.sse import stream_events, usage_of
from serving.api.state import ServingState
from serving.api.validation import (
    check_model,
    check_sampling,
    decode_body,
    effective_max_tokens,
    stop_list,
)


def prompt_tokens(req: CompletionRequest, tokenizer: object) -> list[int]:
    """A string, a one-string list, or token ids."""
    prompt = req.prompt
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            return [int(p) for p in prompt]
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise invalid("prompt must be a string, one string, or token ids", "prompt")
        prompt = prompt[0]
    return list(tokenizer.encode(prompt))  # type: ignore[attr-defined]


class CompletionsController(Controller):
    path = "/v1/completions"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[Completion] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), CompletionRequest)
        check_model(req, serving.model_id)
        check_sampling(req, req.max_tokens, serving.settings.serving.max_tokens_limit)
        _, model = ready(serving)
        prompt = prompt_tokens(req, model.tokenizer)
        max_tokens = effective_max_tokens(req.max_tokens, serving.settings)
        admitted = admit(serving, req, prompt, max_tokens, stop_list(req))
        rid, created, model_id = f"cmpl-{admitted.request_id}", admitted.created, serving.model_id

        def chunk(text: str, finish: str | None = None) -> Completion:
            return Completion(rid, created, model_id, [TextChoice(0, text, finish)])

        def usage_chunk(usage: Usage) -> Completion:
            return Completion(rid, created, model_id, [], usage)

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = stream_events(
                admitted,
                first=None,
                delta=chunk,
                final=lambda reason: chunk("", reason),
                usage=usage_chunk if include_usage else None,
            )
            return Stream(body, media_type="text/event-stream")
        text, done = await admitted.collect(request)
        result = Completion(rid, created, model_id, [TextChoice(0, text, done.finish_reason)])
        result.usage = usage_of(done)
        return Response(result)
