"""The flow chat and text completions share: admit a request, then await or stream its events."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from litestar import Request

from contract.openai_errors import ENGINE_ERROR, SHUTDOWN, TIMEOUT, ApiError
from serving.api.errors import invalid, queue_full, unavailable
from serving.api.state import ServedModel, ServingState
from serving.api.validation import check_context
from serving.engine.engine import Engine, EngineStopping, QueueFull
from serving.engine.kv_budget import BeyondBudget
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

T = TypeVar("T")


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
    prompt_tokens: int
    _held: list[RequestEvent] = field(default_factory=list)  # taken by started()

    async def events(self) -> AsyncIterator[RequestEvent]:
        """Yield until Finished/Failed; a cancelled consumer cancels the request."""
        finished = False
        try:
            while True:
                event = self._held.pop() if self._held else await self.sink.queue.get()
                yield event
                if isinstance(event, Finished | Failed):
                    finished = True
                    return
        finally:
            if not finished:
                self.engine.cancel(self.request_id)

    async def collect(self, request: Request) -> Collected:
        """Await the whole completion; a client that disconnects cancels it."""
        return await _unless_gone(request, self._gather())

    async def started(self, request: Request) -> None:
        """Wait for the first event, which events() then yields first. A failure before it
        is raised: the answer is then an error status (which the gateway resends on a 503),
        not a stream that opens with an error. A client that leaves cancels the request."""
        try:
            event = await _unless_gone(request, self.sink.queue.get())
        except ApiError:
            self.engine.cancel(self.request_id)
            raise
        if isinstance(event, Failed):
            raise failure_error(event)
        self._held.append(event)

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
        raise ApiError(500, "generation ended without a result")


async def _unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; a client that disconnects first cancels it (a 499)."""
    consumer = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if consumer in done:
            return consumer.result()
        raise ApiError(499, "client disconnected")
    finally:
        for task in (consumer, watcher):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def failure_error(event: Failed) -> ApiError:
    # A failed engine means the gang is going away: 503 tells the gateway to resend elsewhere.
    status = {TIMEOUT: 504, SHUTDOWN: 503, ENGINE_ERROR: 503}.get(event.code, 500)
    return ApiError(status, event.message, code=event.code)


def ready(state: ServingState) -> tuple[Engine, ServedModel]:
    if state.status != "ready" or state.engine is None or state.model is None:
        raise unavailable(f"model is {state.status}")
    return state.engine, state.model


def admit(
    state: ServingState,
    prompt: list[int],
    params: SamplingParams,
    stop: list[str],
    top_logprobs: int | None = None,
    param: str = "messages",
) -> Admitted:
    """Check the prompt against the model (`param`: the field it came from) and hand the
    request to the engine."""
    engine, model = ready(state)
    if not prompt:
        raise invalid("The prompt must not be empty", "prompt")
    if min(prompt) < 0 or max(prompt) >= model.vocab_size:
        raise invalid(f"Token ids must be in [0, {model.vocab_size})", "prompt")
    check_context(len(prompt), params.max_tokens, model.context_length, param)
    sink = EventSink(asyncio.get_running_loop())
    request_id = uuid.uuid4().hex
    request = GenerationRequest(
        request_id, prompt, params, stop, sink,
        deadline=time.monotonic() + state.settings.serving.request_timeout_s,
        top_logprobs=top_logprobs,
    )
    try:
        engine.submit(request)
    except BeyondBudget as exc:
        raise invalid(str(exc), param, code="kv_budget_exceeded") from exc
    except QueueFull as exc:
        raise queue_full(f"Too many requests waiting: {exc}") from exc
    except EngineStopping as exc:
        raise unavailable(str(exc)) from exc
    return Admitted(request_id, int(time.time()), engine, sink, len(prompt))


def random_seed() -> int:
    return random.getrandbits(62)
