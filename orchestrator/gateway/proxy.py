"""Forwards `/v1/*` to rank 0, holding requests through restarts.

A request that has not sent a byte to its client yet is resent to the next gang; a stream
cut mid-way ends with an SSE error event in its API's shape, never a hang. A request that
was at rank 0 when its gang failed is resent alone, and answered with an error if that
fails the gang again (orchestrator/gateway/quarantine.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from contract import launch_secret
from contract.anthropic_schemas import MESSAGES_PATH, anthropic_error, anthropic_event
from contract.openai_errors import (
    DONE_EVENT,
    GANG_FAILURE_CODES,
    ApiError,
    error_code_of_event,
    sse_error_event,
)
from contract.responses_schemas import RESPONSES_PATH
from contract.responses_schemas import error_event as responses_error_event
from orchestrator.gateway.booking import Booking
from orchestrator.gateway.errors import unavailable
from orchestrator.gateway.quarantine import (
    CAUSE_WAIT_S,
    MAX_RESTARTS_PER_REQUEST,
    IsolationGate,
    could_be_the_request,
    request_of_death,
)
from orchestrator.gateway.view import ClusterView, Upstream
from orchestrator.supervision.metrics import GatewayCounters
from orchestrator.supervision.state import GangState
from orchestrator.tls import pinned_for

# Headers describing the body or the hop, which aiohttp recomputes.
_HOP_HEADERS = {
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "authorization",
    "x-api-key",  # the gateway's key, as Anthropic's clients send it
    launch_secret.HEADER.lower(),  # the gateway's own, below: never a client's
    "keep-alive",
    "accept-encoding",
}


class StreamFlag(msgspec.Struct):
    stream: bool = False


# The last event of a stream whose gang failed after its first token.
_STREAM_CUT = ApiError(
    502, "the cluster lost a rank while generating this response; retry the request",
    code="stream_interrupted",
)


def stream_cut_event(path: str) -> bytes:
    """That event in the stream's own format: Anthropic's on /v1/messages, the Responses
    API's `error` event on /v1/responses, else OpenAI's."""
    if path.startswith(MESSAGES_PATH):
        return anthropic_event(anthropic_error(_STREAM_CUT))
    if path.startswith(RESPONSES_PATH):
        return responses_error_event(_STREAM_CUT)
    return sse_error_event(_STREAM_CUT.body) + DONE_EVENT


# aiohttp's connection errors, and its timeouts (connect) which are asyncio's.
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class UpstreamLost(Exception):
    """The gang went away before this request's response began. `in_flight`: rank 0 had
    taken the request (maybe a suspect), rather than refused it at the door."""

    def __init__(self, message: str, *, in_flight: bool) -> None:
        super().__init__(message)
        self.in_flight = in_flight
        self.launch_id = ""  # the launch that lost it (set by Proxy._attempt)


# Rank 0's messages to the requests it held when its engine failed or it was stopped
# (serving/rank/rank0.py, serving/engine/engine.py); Anthropic's shape carries no code.
_IN_FLIGHT_MESSAGES = ("engine failed", "server is shutting down")


def engine_failed(body: bytes) -> bool:
    """Whether a 503 from rank 0 ended a request it had taken (vs refused at the door)."""
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return False
    message = error.get("message")
    return error.get("code") in GANG_FAILURE_CODES or (
        isinstance(message, str) and message.startswith(_IN_FLIGHT_MESSAGES)
    )


class ProxyResult(msgspec.Struct):
    status: int
    headers: dict[str, str]
    first_chunk: bytes
    rest: AsyncIterator[bytes] | None


def wants_stream(body: bytes) -> bool:
    try:
        return msgspec.json.decode(body, type=StreamFlag).stream
    except msgspec.DecodeError:
        return False  # rank 0 answers malformed JSON with its own 400


class Proxy:
    def __init__(
        self,
        view: ClusterView,
        client: aiohttp.ClientSession,
        metrics: GatewayCounters,
        request_timeout_s: float,
        in_flight: Counter[str] | None = None,
        books: Callable[[str], GatewayCounters] | None = None,
    ) -> None:
        self.view, self.client = view, client
        # A launch id's counters (orchestrator/gateway/booking.py); one instance: `metrics`.
        self.books: Callable[[str], GatewayCounters] = books or (lambda _launch: metrics)
        self.request_timeout_s = request_timeout_s
        self.gate = IsolationGate()
        # This proxy's requests at each launch's rank 0, until their answer ends: the
        # work routing weighs replicas by (orchestrator/gateway/routing.py).
        self.in_flight: Counter[str] = Counter() if in_flight is None else in_flight

    async def forward(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes,
        booking: Booking | None = None,
    ) -> ProxyResult:
        """`booking`: where the request is booked; moved to each instance it is sent to."""
        booking = booking or Booking(self.books(""))
        deadline = time.monotonic() + self.request_timeout_s
        failed_launch = ""
        losses = 0  # gangs that failed with this request at rank 0
        alone = False  # the last of them could be its doing: run it alone (a suspect)
        while True:
            try:
                return await self._attempt(
                    booking, alone, deadline, failed_launch, method, path, query, headers, body)
            except UpstreamLost as lost:
                failed_launch = lost.launch_id
                if lost.in_flight:
                    losses += 1
                    if losses >= MAX_RESTARTS_PER_REQUEST:
                        raise await self._quarantine(failed_launch, booking, alone) from None
                    wait = min(CAUSE_WAIT_S, max(0.0, deadline - time.monotonic()))
                    alone = could_be_the_request(await self.view.failure_of(failed_launch, wait))
                booking.counters.requests_retried.inc()

    async def _attempt(
        self, booking: Booking, alone: bool, deadline: float, not_launch: str,
        method: str, path: str, query: str, headers: dict[str, str], body: bytes,
    ) -> ProxyResult:
        """One send to the least busy ready rank 0 (other than `not_launch`); UpstreamLost
        names the launch that lost it."""
        async with self._gate(isolated=alone, deadline=deadline, booking=booking):
            upstream = await self.view.wait_for_upstream(deadline - time.monotonic(), not_launch)
            if upstream is None:
                booking.counters.requests_failed.labels(reason="unavailable").inc()
                raise self._unavailable_error()
            booking.counters = self.books(upstream.launch_id)
            self.view.wake_workers()
            try:
                return await self._counted(
                    upstream, booking, method, path, query, headers, body, wants_stream(body))
            except UpstreamLost as lost:
                lost.launch_id = upstream.launch_id
                raise

    @asynccontextmanager
    async def _gate(
        self, *, isolated: bool, deadline: float, booking: Booking
    ) -> AsyncIterator[None]:
        """Rank 0 shared with other ordinary requests, or alone for a suspect."""
        gate: Any = self.gate.isolated() if isolated else self.gate.ordinary()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await gate.__aenter__()
        except TimeoutError:
            booking.counters.requests_failed.labels(reason="unavailable").inc()
            raise self._unavailable_error() from None
        try:
            yield
        finally:
            await gate.__aexit__(None, None, None)

    async def _quarantine(self, failed_launch: str, booking: Booking, alone: bool) -> ApiError:
        """The error for a request whose second run failed a gang, naming the failure once
        the supervisor has classified it."""
        booking.counters.requests_quarantined.inc()
        booking.counters.request_of_death_restarts.inc(MAX_RESTARTS_PER_REQUEST)
        failure = await self.view.failure_of(failed_launch, CAUSE_WAIT_S)
        return request_of_death(failure.summary() if failure else "", alone=alone)

    async def _counted(
        self, upstream: Upstream, booking: Booking, *args: Any
    ) -> ProxyResult:
        """_send, with the request counted at its launch until its answer ends."""
        launch = upstream.launch_id
        self.in_flight[launch] += 1
        try:
            result = await self._send(upstream, booking.counters, *args)
        except BaseException:
            self._release(launch)
            raise
        if result.rest is None:
            self._release(launch)
            return result
        result.rest = self._released_after(result.rest, launch)
        return result

    def _release(self, launch: str) -> None:
        self.in_flight[launch] -= 1
        if self.in_flight[launch] <= 0:
            del self.in_flight[launch]

    async def _released_after(
        self, rest: AsyncIterator[bytes], launch: str
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in rest:
                yield chunk
        finally:
            self._release(launch)

    async def _send(
        self,
        upstream: Upstream,
        counters: GatewayCounters,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        stream: bool,
    ) -> ProxyResult:
        url = f"{upstream.url}{path}" + (f"?{query}" if query else "")
        # ASGI decoded the values as latin-1; check_utf8 (errors.py) let only UTF-8 through,
        # and aiohttp encodes str values as UTF-8: rank 0 gets the client's bytes.
        forwarded = {
            k: v.encode("latin-1").decode("utf-8")
            for k, v in headers.items()
            if k.lower() not in _HOP_HEADERS
        }
        if upstream.secret:
            forwarded[launch_secret.HEADER] = upstream.secret
        try:
            response = await self.client.request(
                method, url, data=body, headers=forwarded, ssl=pinned_for(upstream.tls_cert))
        except TRANSPORT_ERRORS as exc:
            # Not connected: rank 0 never saw it. Any other break: it was at rank 0.
            connected = not isinstance(exc, aiohttp.ClientConnectorError | TimeoutError)
            raise UpstreamLost(str(exc), in_flight=connected) from exc
        if response.status == 503:  # rank 0 is stopping: its gang is going away
            try:
                taken = engine_failed(await response.read())
            except TRANSPORT_ERRORS:
                taken = True
            response.close()
            raise UpstreamLost("rank 0 is stopping", in_flight=taken)
        chunks = response.content.iter_any()
        try:
            # Until the client has a byte, a lost gang means "resend", so a plain response
            # is read whole and a stream up to its first event.
            first = await anext(chunks, b"") if stream else await response.read()
        except TRANSPORT_ERRORS as exc:
            response.close()
            raise UpstreamLost(str(exc), in_flight=True) from exc
        result_headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() in {"content-type", "retry-after", "cache-control"}
        }
        if not stream:
            response.release()
            return ProxyResult(response.status, result_headers, first, None)
        if error_code_of_event(first) in GANG_FAILURE_CODES:
            response.close()
            raise UpstreamLost(
                "rank 0's engine failed before the stream's first token", in_flight=True)
        rest = self._rest(response, chunks, stream_cut_event(path), counters)
        return ProxyResult(response.status, result_headers, first, rest)

    async def _rest(
        self, response: aiohttp.ClientResponse, chunks: AsyncIterator[bytes], cut: bytes,
        counters: GatewayCounters,
    ) -> AsyncIterator[bytes]:
        whole = False
        try:
            async for chunk in chunks:
                yield chunk
            whole = True
        except TRANSPORT_ERRORS:
            counters.requests_failed.labels(reason="stream_cut").inc()
            yield cut
        finally:
            # Read to the end: the connection goes back to the pool. Else (the client left,
            # the stream broke) it is closed: rank 0 sees that and frees the batch slot.
            if whole:
                response.release()
            else:
                response.close()

    def _unavailable_error(self) -> ApiError:
        state = self.view.state
        if self.view.draining:
            return unavailable("the orchestrator is shutting down", 5, code="shutting_down")
        if state == GangState.FAILED:
            return unavailable(f"cluster failed: {self.view.reason}", 60, code="cluster_failed")
        detail = f" ({self.view.reason})" if self.view.reason else ""
        return unavailable(f"cluster not ready within the request timeout: {state}{detail}", 5)
