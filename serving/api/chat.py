"""POST /v1/chat/completions."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from serving.api.generation import admit, ready
from serving.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Delta,
    Usage,
)
from serving.api.sse import stream_events, usage_of
from serving.api.state import ServingState
from serving.api.validation import (
    chat_messages,
    check_model,
    check_sampling,
    decode_body,
    effective_max_tokens,
    stop_list,
)


class ChatController(Controller):
    path = "/v1/chat/completions"

    @post("/", status_code=200)
    async def create(self, request: Request, state: State) -> Response[ChatCompletion] | Stream:
        serving: ServingState = state.serving
        req = decode_body(await request.body(), ChatCompletionRequest)
        check_model(req, serving.model_id)
        requested = req.max_completion_tokens or req.max_tokens
        check_sampling(req, requested, serving.settings.serving.max_tokens_limit)
        messages = chat_messages(req)
        _, model = ready(serving)
        prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        max_tokens = effective_max_tokens(requested, serving.settings)
        admitted = admit(serving, req, list(prompt), max_tokens, stop_list(req))
        rid, created = f"chatcmpl-{admitted.request_id}", admitted.created
        model_id = serving.model_id

        def chunk(delta: Delta, finish: str | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(rid, created, model_id, [ChatChunkChoice(0, delta, finish)])

        def usage_chunk(usage: Usage) -> ChatCompletionChunk:
            return ChatCompletionChunk(rid, created, model_id, [], usage)

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = stream_events(
                admitted,
                first=lambda: chunk(Delta(role="assistant", content="")),
                delta=lambda text: chunk(Delta(content=text)),
                final=lambda reason: chunk(Delta(), reason),
                usage=usage_chunk if include_usage else None,
            )
            return Stream(body, media_type="text/event-stream")
        text, done = await admitted.collect(request)
        choice = ChatChoice(0, AssistantMessage("assistant", text), done.finish_reason)
        return Response(ChatCompletion(rid, created, model_id, [choice], usage_of(done)))
