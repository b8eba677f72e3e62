"""What flows between the HTTP handlers (event loop) and the engine thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from serving.engine.step_plan import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability, and the `top` most likely (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens behind this text, when asked for


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the stop string that ended it (Anthropic reports it)
    # Seconds from joining the batch to the first token (prefill), and from there to the
    # last (decode): the answers' `timings`. Not compared: they differ run to run.
    prompt_s: float = field(default=0.0, compare=False)
    generation_s: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Failed:
    message: str
    code: str  # "timeout" | "shutdown" | "engine_error"


RequestEvent = TextDelta | Finished | Failed


class EventSink:
    """Thread-safe handoff of engine events to one request's asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the handler's event loop (serving/engine/arrivals.py hops through it)
        self.queue: asyncio.Queue[RequestEvent] = asyncio.Queue()

    def push(self, event: RequestEvent) -> None:
        """Called from the engine thread."""
        # RuntimeError: the loop has closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


@dataclass
class GenerationRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    stop: list[str]
    sink: EventSink
    deadline: float  # time.monotonic() after which the request fails with "timeout"
    top_logprobs: int | None = None  # None: no logprobs; n: each token's and the top n
    created: float = field(default_factory=time.monotonic)

    @property
    def kv_tokens(self) -> int:
        """The most tokens its KV cache may hold: its prompt plus its max_tokens."""
        return len(self.prompt) + self.params.max_tokens
