"""The flow chat and text completions share: admit a request, then await or stream its events."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from litestar import Request

from contract.openai_errors import ENGINE_ERROR, SHUTDOWN, TIMEOUT
from contract.openai_schemas import ChatCompletionRequest, SamplingFields
from serving.api.errors import OpenAIError, invalid, queue_full, unavailable
from serving.api.state import ServedModel, ServingState
from serving.api.validation import check_context, logit_bias_pairs
from serving.engine.engine import Engine, EngineStopping, QueueFull
from serving.engine.requests import (
    EventSink,
    Failed,
    Finished,
    GenerationRequest,
    RequestEvent,
    TextDelta,
    TokenLogprob,
)
from serving.engine.step_plan import SamplingParams


@dataclass(frozen=True)
class Collected:
    """A whole completion: its text, its tokens' logprobs (when asked for), how it ended."""

    text: str
    logprobs: list[TokenLogprob]
    finished: Finished


@dataclass
class Admitted:
    """A request the engine accepted; iterate its events or collect them."""

    request_id: str
    created: int
    engine: Engine
    sink: EventSink

    async def events(self) -> AsyncIterator[RequestEvent]:
        """Yield until Finished/Failed; a cancelled consumer cancels the request."""
        finished = False
        try:
            while True:
                event = await self.sink.queue.get()
                yield event
                if isinstance(event, Finished | Failed):
                    finished = True
                    return
        finally:
            if not finished:
                self.engine.cancel(self.request_id)

    async def collect(self, request: Request) -> Collected:
        """Await the whole completion; a client that disconnects cancels it."""
        consumer = asyncio.ensure_future(self._gather())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if consumer in done:
                return consumer.result()
            raise OpenAIError(499, "client disconnected", type="api_error", code="client_closed")
        finally:
            for task in (consumer, watcher):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _gather(self) -> Collected:
        parts: list[str] = []
        logprobs: list[TokenLogprob] = []
        async for event in self.events():
            if isinstance(event, TextDelta):
                parts.append(event.text)
                logprobs.extend(event.logprobs)
            elif isinstance(event, Failed):
                raise failure_error(event)
            else:
                return Collected("".join(parts), logprobs, event)
        raise OpenAIError(500, "generation ended without a result", type="api_error")


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def failure_error(event: Failed) -> OpenAIError:
    # A failed engine means the gang is going away: 503 tells the gateway to resend elsewhere.
    status = {TIMEOUT: 504, SHUTDOWN: 503, ENGINE_ERROR: 503}.get(event.code, 500)
    err_type = "timeout" if event.code == TIMEOUT else "api_error"
    return OpenAIError(status, event.message, type=err_type, code=event.code)


def ready(state: ServingState) -> tuple[Engine, ServedModel]:
    if state.status != "ready" or state.engine is None or state.model is None:
        raise unavailable(f"model is {state.status}")
    return state.engine, state.model


def admit(
    state: ServingState,
    fields: SamplingFields,
    prompt: list[int],
    max_tokens: int,
    stop: list[str],
    top_logprobs: int | None = None,
) -> Admitted:
    """Check the context budget and hand the request to the engine."""
    engine, model = ready(state)
    if not prompt:
        raise invalid("The prompt must not be empty", "prompt")
    if min(prompt) < 0 or max(prompt) >= model.vocab_size:
        raise invalid(f"Token ids must be in [0, {model.vocab_size})", "prompt")
    param = "messages" if isinstance(fields, ChatCompletionRequest) else "prompt"
    check_context(len(prompt), max_tokens, model.context_length, param)
    params = SamplingParams(
        temperature=1.0 if fields.temperature is None else fields.temperature,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        top_k=fields.top_k or 0,
        max_tokens=max_tokens,
        seed=random.getrandbits(62) if fields.seed is None else fields.seed % (1 << 62),
        min_p=fields.min_p or 0.0,
        repetition_penalty=fields.repetition_penalty or 1.0,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        logit_bias=logit_bias_pairs(fields.logit_bias, model.vocab_size),
        forced=model.forced_output,
    )
    sink = EventSink(asyncio.get_running_loop())
    request_id = uuid.uuid4().hex
    request = GenerationRequest(
        request_id, prompt, params, stop, sink,
        deadline=time.monotonic() + state.settings.serving.request_timeout_s,
        top_logprobs=top_logprobs,
    )
    try:
        engine.submit(request)
    except QueueFull as exc:
        raise queue_full(f"Too many requests waiting: {exc}") from exc
    except EngineStopping as exc:
        raise unavailable(str(exc)) from exc
    return Admitted(request_id, int(time.time()), engine, sink)
