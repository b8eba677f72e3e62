"""A fake rank 0 for the gateway's tests: a real HTTP server whose answers each test
scripts as a function from httpx.Request to httpx.Response, and the cluster as the gateway
sees it (FakeView), which a test moves between states and launches."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
from aiohttp import web

from orchestrator.status.model import ClusterStatus
from orchestrator.supervision.failures import RankFailure
from orchestrator.supervision.snapshot import Upstream
from orchestrator.supervision.state import GangState

KEY = "k-123"
Handler = Callable[[httpx.Request], httpx.Response]


class FakeView:
    """The cluster as the gateway sees it; the test moves it between states and launches.
    Rank 0 of launch L is `<fake rank 0 server>/rank0-L`."""

    def __init__(self) -> None:
        self.base_url = ""  # set by the gateway fixture
        self.state = GangState.READY
        self.reason = ""
        self.draining = False
        self.launch = "l1"
        self.wakes = 0  # requests that told the view to wake the workers
        self.failures: dict[str, RankFailure] = {}  # by launch id, as the supervisor saw them

    def to(self, state: GangState, launch: str | None = None, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.launch = launch or self.launch

    def wake_workers(self) -> None:
        self.wakes += 1

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        # Polls: the test client runs the app in a thread of its own, so no asyncio.Event.
        deadline = time.monotonic() + timeout_s
        while self.state != GangState.READY or self.launch == not_launch:
            ended = self.state == GangState.FAILED or self.draining
            if ended or time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.01)
        return Upstream(f"{self.base_url}/rank0-{self.launch}", self.launch,
                        secret=f"secret-{self.launch}")


    async def failure_of(self, launch_id: str, timeout_s: float) -> RankFailure | None:
        """As the supervisor's view: waits while `launch_id` is the ready launch."""
        deadline = time.monotonic() + timeout_s
        while launch_id not in self.failures and time.monotonic() < deadline:
            if self.state != GangState.READY or self.launch != launch_id or self.draining:
                break
            await asyncio.sleep(0.01)
        return self.failures.get(launch_id)


class Chunks(httpx.AsyncByteStream):
    """A response body arriving in chunks, as over a socket (cut: it breaks after them, as
    when rank 0 dies mid-stream)."""

    def __init__(self, *chunks: bytes, cut: bool = False) -> None:
        self.chunks, self.cut = chunks, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.cut:
            raise httpx.ReadError("connection reset")


def sse(*chunks: bytes, cut: bool = False) -> httpx.Response:
    headers = {"content-type": "text/event-stream"}
    return httpx.Response(200, headers=headers, stream=Chunks(*chunks, cut=cut))


def status() -> ClusterStatus:
    return ClusterStatus(
        cluster="c", state="ready", api_url="u", model="m", backend="ring", orchestrator_pid=1
    )


async def answer(handler: Handler, request: web.Request) -> web.StreamResponse:
    """Serve one request the way `handler` scripts it: the request as httpx sees it (its
    host naming the launch: /rank0-l1/v1/... is http://rank0-l1/v1/...), the answer whole
    or, for a Chunks body, chunk by chunk, the connection cut where the script says so."""
    launch, _, path = request.path_qs.removeprefix("/").partition("/")
    scripted = handler(httpx.Request(
        request.method, f"http://{launch}/{path}", headers=list(request.headers.items()),
        content=await request.read(),
    ))
    headers = {k: v for k, v in scripted.headers.items() if k.lower() != "content-length"}
    if not isinstance(scripted.stream, Chunks):
        return web.Response(status=scripted.status_code, headers=headers,
                            body=await scripted.aread())
    response = web.StreamResponse(status=scripted.status_code, headers=headers)
    await response.prepare(request)
    try:
        async for chunk in scripted.stream:
            await response.write(chunk)
    except httpx.ReadError:
        assert request.transport is not None
        request.transport.abort()  # rank 0 died: the connection ends without the last chunk
        return response
    await response.write_eof()
    return response


@contextlib.contextmanager
def fake_rank0(handler: Handler) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1, its loop in a thread of its own; yields its URL."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await answer(handler, request)

    async def start() -> web.AppRunner:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # rank 0 here takes any size
        app.router.add_route("*", "/{tail:.*}", route)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
