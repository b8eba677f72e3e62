"""POST /v1/completions."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from contract.openai_schemas import Completion, CompletionRequest, TextChoice, Usage
from serving.api.admission import admit_openai
from serving.api.errors import invalid
from serving.api.logprobs import completion_logprobs as logprobs_body
from serving.api.sse import stream_events, usage_of
from serving.api.state import ServingState
from serving.api.timings import timings_of
from serving.engine.requests import Finished, TextDelta


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
        got = await admit_openai(request, serving, CompletionRequest, prompt_tokens)
        req, admitted, model, top = got.req, got.admitted, got.model, got.top
        rid, created, model_id = f"cmpl-{admitted.request_id}", admitted.created, serving.model_id
        sent = 0  # characters streamed so far: the text offset of the next tokens

        def chunk(event: TextDelta) -> list[object]:
            nonlocal sent
            lp = None
            if top is not None:
                lp = logprobs_body(event.logprobs, model.tokenizer, top, sent)
            sent += len(event.text)
            return [Completion(rid, created, model_id, [TextChoice(0, event.text, None, lp)])]

        def final(done: Finished) -> list[object]:
            return [Completion(rid, created, model_id, [TextChoice(0, "", done.finish_reason)])]

        def usage_chunk(usage: Usage) -> Completion:
            return Completion(rid, created, model_id, [], usage)

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = stream_events(
                admitted,
                first=None,
                delta=chunk,
                final=final,
                usage=usage_chunk if include_usage else None,
                timed=bool(req.timings_per_token),
            )
            return Stream(body, media_type="text/event-stream")
        whole = await admitted.collect(request)
        lp = None if top is None else logprobs_body(whole.logprobs, model.tokenizer, top)
        choice = TextChoice(0, whole.text, whole.finished.finish_reason, lp)
        answer = Completion(rid, created, model_id, [choice], usage_of(whole.finished))
        if req.timings_per_token:
            answer.timings = timings_of(whole.finished)
        return Response(answer)
