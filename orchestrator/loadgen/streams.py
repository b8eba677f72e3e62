"""Streamed chat requests timed chunk by chunk, one at a time or N at once.

The one copy of this logic: `orchestrator bench` measures a running cluster with it, and
bench/serving.py and bench/gateway.py measure theirs with it too.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Body = dict[str, Any]
OnToken = Callable[[int], None]  # called with the stream's index on each content chunk


@dataclass
class StreamTimes:
    """One stream: when it was sent, when each chunk with content arrived (perf_counter),
    the usage the server reported, and why it failed ("" if it did not)."""

    started: float
    arrivals: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str = ""

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0] - self.started if self.arrivals else None

    @property
    def gaps_s(self) -> list[float]:
        """Inter-token latencies: the time between consecutive content chunks."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    @property
    def tokens(self) -> int:
        """Generated tokens: the server's count when it gave one, else content chunks."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.arrivals)


def chat_body(model: str, text: str, max_tokens: int, *, usage: bool = False) -> Body:
    """A streamed, greedy chat request with one user message."""
    body: Body = {"model": model, "messages": [{"role": "user", "content": text}],
                  "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if usage:  # a last chunk with the token counts
        body["stream_options"] = {"include_usage": True}
    return body


def content_of(line: str) -> str | None:
    """A chat chunk's delta content ("" if none); None for a line that is no chunk."""
    if not line.startswith("data: {"):
        return None
    choices = json.loads(line[6:]).get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content") or "")


def stream_chat(
    client: httpx.Client, url: str, body: Body, on_token: Callable[[], None] | None = None
) -> StreamTimes:
    """POST one streamed chat to `url`/v1/chat/completions and time its chunks; a failure
    (HTTP status, an SSE error event, a dropped connection) is recorded, not raised."""
    times = StreamTimes(started=time.perf_counter())
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                times.error = f"HTTP {response.status_code}: {_message(response.read())}"
                return times
            for line in response.iter_lines():
                _take(times, line, on_token)
                if times.error:
                    return times
    except httpx.HTTPError as exc:
        times.error = f"{type(exc).__name__}: {exc}"
    return times


def _take(times: StreamTimes, line: str, on_token: Callable[[], None] | None) -> None:
    if not line.startswith("data: {"):
        return
    chunk = json.loads(line[6:])
    if "error" in chunk:
        times.error = f"stream error: {_message(line[6:].encode())}"
        return
    if usage := chunk.get("usage"):
        times.prompt_tokens = usage.get("prompt_tokens")
        times.completion_tokens = usage.get("completion_tokens")
    if content_of(line):
        times.arrivals.append(time.perf_counter())
        if on_token is not None:
            on_token()


def _message(body: bytes) -> str:
    """An OpenAI-shaped error's message, or the start of whatever the body was."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def concurrent_streams(
    url: str, bodies: list[Body], *, headers: dict[str, str] | None = None,
    on_token: OnToken | None = None, timeout_s: float = 1800.0,
    client: httpx.Client | None = None,
) -> tuple[list[StreamTimes], float]:
    """All `bodies` streamed at once, one thread each, over `client` (or a pooled client of
    its own, sending `headers`); returns each stream's times (in the order of `bodies`) and
    the wall time from the first send to the last end."""
    results: list[StreamTimes | None] = [None] * len(bodies)
    with contextlib.ExitStack() as stack:
        if client is None:
            limits = httpx.Limits(max_connections=len(bodies),
                                  max_keepalive_connections=len(bodies))
            client = stack.enter_context(
                httpx.Client(timeout=timeout_s, limits=limits, headers=headers))
        pooled = client

        def run(i: int) -> None:
            tick = (lambda: on_token(i)) if on_token is not None else None
            results[i] = stream_chat(pooled, url, bodies[i], tick)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    return [r if r is not None else StreamTimes(start, error="no result") for r in results], wall


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: a value that was observed, never an interpolation."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]
