"""The cluster's one endpoint: `/v1/*` proxied to rank 0 (OpenAI's API with its Responses,
and Anthropic's Messages), plus `/health`, `/status`, `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from litestar import Litestar, Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from litestar.params import JSONBody
from litestar.response import Stream

from contract.anthropic_schemas import (
    MESSAGES_PATH,
    CountTokensRequest,
    Message,
    MessagesRequest,
    StreamEvent,
    TokenCount,
)
from contract.openai_errors import ApiError
from contract.openai_schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from contract.responses_schemas import RESPONSES_PATH, ResponsesRequest
from contract.responses_schemas import Response as ResponseBody
from contract.responses_schemas import StreamEvent as ResponsesEvent
from orchestrator.gateway.booking import Booking
from orchestrator.gateway.charts import ChartHistory, sampling
from orchestrator.gateway.errors import (
    ClientGone,
    api_error_handler,
    check_utf8,
    http_exception_handler,
    unauthorized,
    unexpected_error_handler,
)
from orchestrator.gateway.intake import BodySlots, read_body_bounded
from orchestrator.gateway.live import live_endpoint
from orchestrator.gateway.openapi import (
    API_KEY_HEADER,
    BEARER,
    X_API_KEY,
    documented,
    error_responses,
    openapi_config,
    streamed,
)
from orchestrator.gateway.proxy import Proxy, ProxyResult
from orchestrator.gateway.rank0_metrics import Rank0Metrics
from orchestrator.gateway.routing import ModelRouter, model_of
from orchestrator.gateway.scrape import rank0_metrics
from orchestrator.gateway.view import ClusterView
from orchestrator.status.model import ClusterStatus
from orchestrator.supervision.metrics import GatewayCounters, OrchestratorMetrics
from orchestrator.supervision.progress import ServingSample
from orchestrator.supervision.state import GangState

MAX_BODY_BYTES = 8 * 1024 * 1024
PROMETHEUS_TEXT = "text/plain; version=0.0.4"  # Litestar adds the charset
PAGE = (Path(__file__).parent / "page.html").read_bytes()


@dataclass
class Gateway:
    """What the handlers share, kept on the app's State."""

    view: ClusterView
    status: Callable[[], ClusterStatus]
    metrics: OrchestratorMetrics  # serves /metrics; one instance: its requests booked here
    api_key: str | None
    router: ModelRouter | None = None  # several models: which route a request's model takes
    proxy: Proxy | None = None
    proxies: dict[str, Proxy] = field(default_factory=dict)  # by model id, with a router
    # Where a request no instance saw is booked: `metrics`, or with several instances
    # the gateway's own (orchestrator/gateway/booking.py).
    counters: GatewayCounters | None = None

    @property
    def unrouted(self) -> GatewayCounters:
        return self.counters or self.metrics

    def proxy_for(self, body: bytes) -> Proxy:
        """The proxy of the model the request names (one model: the only proxy)."""
        if self.router is None or len(self.router.routes) == 1:
            proxy = self.proxy or next(iter(self.proxies.values()), None)
            assert proxy is not None, "the lifespan opens the proxy"
            return proxy
        return self.proxies[self.router.route(model_of(body)).model_id]
    # Rank 0's /metrics, cached per instance (orchestrator/gateway/rank0_metrics.py)
    rank0_caches: dict[str, Rank0Metrics] = field(default_factory=dict)
    bodies: BodySlots = field(default_factory=BodySlots)  # orchestrator/gateway/intake.py


def _gateway(state: State) -> Gateway:
    gateway: Gateway = state.gateway
    return gateway


async def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    # Async on purpose: Litestar runs a sync guard in a worker thread, which cost every
    # proxied request a thread hop and a context copy (12% of the gateway's CPU).
    expected = _gateway(connection.app.state).api_key
    if expected is None or connection.scope.get("method") == "OPTIONS":
        return  # OPTIONS only names the methods (and a CORS preflight never has the key)
    header = connection.headers.get("authorization", "")
    scheme, _space, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = connection.headers.get(API_KEY_HEADER, "")  # Anthropic's clients send this
    if not given:
        raise unauthorized(
            f"missing API key: send 'Authorization: Bearer <key>' or '{API_KEY_HEADER}: <key>'"
        )
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise unauthorized("incorrect API key")


ChatBody, ChatOperation = streamed(ChatCompletionRequest, ChatCompletionChunk)
CompletionBody, CompletionOperation = streamed(CompletionRequest, Completion)


@post(
    "/chat/completions",
    operation_id="createChatCompletion",
    summary="Create a chat completion",
    operation_class=ChatOperation,
    dto=ChatBody,
    return_dto=None,
    status_code=200,
    responses=error_responses(400, 401, 404, 413, 429, 503, 504),
)
async def chat_completions(
    request: Request, state: State, data: JSONBody[ChatCompletionRequest | None] = None
) -> Response[ChatCompletion]:
    """A chat completion, whole or streamed; forwarded to rank 0 as sent."""
    return await _forward(request, state, "/v1/chat/completions")


@post(
    "/completions",
    operation_id="createCompletion",
    summary="Create a text completion",
    operation_class=CompletionOperation,
    dto=CompletionBody,
    return_dto=None,
    status_code=200,
    responses=error_responses(400, 401, 404, 413, 429, 503, 504),
)
async def completions(
    request: Request, state: State, data: JSONBody[CompletionRequest | None] = None
) -> Response[Completion]:
    """A text completion, whole or streamed; forwarded to rank 0 as sent."""
    return await _forward(request, state, "/v1/completions")


MessagesBody, MessagesOperation = streamed(MessagesRequest, StreamEvent, named=True)


@post(
    "/messages",
    operation_id="createMessage",
    summary="Create a message (Anthropic's Messages API)",
    operation_class=MessagesOperation,
    dto=MessagesBody,
    return_dto=None,
    status_code=200,
    responses=error_responses(400, 401, 404, 413, 429, 503, 504, anthropic=True),
)
async def messages(
    request: Request, state: State, data: JSONBody[MessagesRequest | None] = None
) -> Response[Message]:
    """A message, whole or as Anthropic's event stream; forwarded to rank 0 as sent."""
    return await _forward(request, state, MESSAGES_PATH)


@post(
    "/messages/count_tokens",
    operation_id="countMessageTokens",
    summary="Count a message's input tokens (Anthropic's Messages API)",
    dto=documented(CountTokensRequest),
    return_dto=None,
    status_code=200,
    responses=error_responses(400, 401, 404, 413, 503, anthropic=True),
)
async def count_tokens(
    request: Request, state: State, data: JSONBody[CountTokensRequest | None] = None
) -> Response[TokenCount]:
    """The prompt's tokens as rank 0's chat template renders it, tools included."""
    return await _forward(request, state, f"{MESSAGES_PATH}/count_tokens")


ResponsesBody, ResponsesOperation = streamed(ResponsesRequest, ResponsesEvent, named=True)


@post(
    "/responses",
    operation_id="createResponse",
    summary="Create a model response (OpenAI's Responses API)",
    operation_class=ResponsesOperation,
    dto=ResponsesBody,
    return_dto=None,
    status_code=200,
    responses=error_responses(400, 401, 404, 413, 429, 503, 504),
)
async def responses(
    request: Request, state: State, data: JSONBody[ResponsesRequest | None] = None
) -> Response[ResponseBody]:
    """A response, whole or as the Responses event stream; forwarded to rank 0 as sent."""
    return await _forward(request, state, RESPONSES_PATH)


@get("/models", operation_id="listModels", summary="List models",
     responses=error_responses(400, 401, 503))
async def models(request: Request, state: State) -> Response[ModelList]:
    """The models the cluster serves: each id once (aliases are not listed: see
    docs/operations.md, routing)."""
    router = _gateway(state).router
    if router is None or len(router.routes) == 1:
        return await _forward(request, state, "/v1/models")
    created = int(time.time())
    listed = ModelList([ModelCard(model_id, created) for model_id in router.ids])
    return Response(listed)


def v1_router(api_key: bool) -> Router:
    """OpenAI's routes, each declared so that OPTIONS and 405's Allow name only its methods
    and the OpenAPI document describes it; unknown /v1 paths are 404 here."""
    return Router(
        "/v1",
        route_handlers=[
            chat_completions, completions, messages, count_tokens, responses, models,
        ],
        guards=[require_api_key, read_body_bounded],
        security=[{BEARER: []}, {X_API_KEY: []}] if api_key else None,
        request_max_body_size=MAX_BODY_BYTES,
    )


async def _forward(request: Request, state: State, path: str) -> Response[Any]:
    """The request's own bytes to rank 0 (held through restarts; cancelled if the client
    leaves), its answer back as it comes: whole, or streamed chunk by chunk."""
    body = await request.body()
    headers = dict(request.headers)
    check_utf8(body, headers)
    proxy = _gateway(state).proxy_for(body)
    booking = request.state.booking = Booking(proxy.books(""))  # errors.py books there too
    forward = proxy.forward(request.method, path, request.url.query or "", headers, body,
                            booking)
    result = await _unless_client_leaves(request, forward)
    booking.counters.responses.labels(status=str(result.status)).inc()
    if result.rest is None:
        return Response(result.first_chunk, status_code=result.status, headers=result.headers)
    return Stream(
        _chain(result.first_chunk, result.rest), status_code=result.status, headers=result.headers
    )


async def _unless_client_leaves(request: Request, forward: Awaitable[ProxyResult]) -> ProxyResult:
    """The proxied answer; a client that disconnects first cancels it, which closes the
    connection to rank 0 (rank 0 then frees the batch slot) or ends the wait for a gang."""
    answer = asyncio.ensure_future(forward)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (answer, gone):
            if not task.done():
                task.cancel()
    if not answer.done() or answer.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await answer
        raise ClientGone()
    return answer.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


@get(["/", "/dashboard"], media_type="text/html", include_in_schema=False)
async def page() -> bytes:
    """The status page: no key needed to load it; it asks for one when /status wants it."""
    return PAGE


@get("/health", include_in_schema=False)
async def health_endpoint(state: State) -> Response:
    view = _gateway(state).view
    body = {"status": view.state.value, "reason": view.reason}
    return Response(body, status_code=200 if view.state == GangState.READY else 503)


@get("/status", guards=[require_api_key], include_in_schema=False)
async def status_endpoint(state: State) -> ClusterStatus:
    return _gateway(state).status()


@get("/metrics", include_in_schema=False)
async def metrics_endpoint(state: State) -> Response:
    """The orchestrator's own families, then rank 0's (from a short cache), so the whole
    cluster is one scrape target."""
    gateway = _gateway(state)
    if gateway.proxy is None and not gateway.proxies:
        return Response(gateway.metrics.render(), media_type=PROMETHEUS_TEXT)
    client = (gateway.proxy or next(iter(gateway.proxies.values()))).client
    rank0 = await rank0_metrics(client, gateway.view, gateway.router, gateway.rank0_caches)
    return Response(gateway.metrics.render() + rank0, media_type=PROMETHEUS_TEXT)


def rank0_session() -> aiohttp.ClientSession:
    """The pooled HTTP client the gateway talks to rank 0 with (opened in its event loop)."""
    # aiohttp rather than httpx for this hop: 0.26 vs 0.61 ms per pooled request to rank 0,
    # measured here. No read timeout: a long generation is bounded by rank 0's own request
    # timeout. Nothing is added to the client's headers.
    timeout = aiohttp.ClientTimeout(total=None, connect=5.0)
    # Idle connections closed before rank 0's uvicorn closes them (after 5 s): a request
    # never goes out on a connection the server is closing.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    skip = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=skip, auto_decompress=False
    )


def create_app(
    view: ClusterView,
    status: Callable[[], ClusterStatus],
    metrics: OrchestratorMetrics,
    *,
    api_key: str | None,
    request_timeout_s: float,
    serving: Callable[[], ServingSample | None] | None = None,
    router: ModelRouter | None = None,
    counters: GatewayCounters | None = None,
    instances_serving: Callable[[], Mapping[str, ServingSample | None]] | None = None,
) -> Litestar:
    """`serving`: rank 0's latest counters as the supervisor scraped them, for the charts.
    `router`: several instances (`view` is then every instance together, for /health).
    `counters`: where requests no instance saw are booked (default: `metrics`).
    `instances_serving`: each instance's `serving`, by name (the charts per instance)."""
    gateway = Gateway(view, status, metrics, api_key, router, counters=counters)
    charts = ChartHistory()

    @asynccontextmanager
    async def open_proxy(_: Litestar) -> AsyncIterator[None]:
        async with rank0_session() as client:
            if router is None:
                gateway.proxy = Proxy(view, client, metrics, request_timeout_s)
            for route in router.routes.values() if router else ():
                gateway.proxies[route.model_id] = Proxy(
                    route, client, gateway.unrouted, request_timeout_s, route.in_flight,
                    books=route.books(gateway.unrouted))
            try:
                yield
            finally:
                gateway.proxy = None
                gateway.proxies.clear()

    return Litestar(
        route_handlers=[
            v1_router(api_key is not None), page, health_endpoint, status_endpoint,
            metrics_endpoint,
            Router("/status", route_handlers=[live_endpoint], guards=[require_api_key]),
        ],
        lifespan=[open_proxy, sampling(charts, status, serving, instances_serving)],
        state=State({"gateway": gateway, "charts": charts}),
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_exception_handler,
            Exception: unexpected_error_handler,
        },
        openapi_config=openapi_config(api_key is not None),
        logging_config=None,  # the service configures logging; Litestar must not replace it
    )
