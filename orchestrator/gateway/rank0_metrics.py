"""Rank 0's `/metrics` as the gateway serves them: from a short cache.

`GET /metrics` is unauthenticated (Prometheus scrapes it), so each scrape must not become
a request to rank 0: a flood of them would take rank 0's event loop from its requests and
could stall it past the hang watchdog. Rank 0 is asked at most once per CACHE_S, whatever
the scrape rate; scrapes arriving together share that one request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from ssl import SSLContext

import aiohttp

from orchestrator.gateway.view import ClusterView
from orchestrator.supervision.state import GangState
from orchestrator.tls import pinned_for

CACHE_S = 1.0  # Prometheus scrapes every 15 s or so: a second old is fresh
FETCH_TIMEOUT_S = 2.0
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class Rank0Metrics:
    """The latest text of rank 0's `/metrics`, kept CACHE_S for the launch it came from."""

    def __init__(self, cache_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache_s, self.clock = cache_s, clock
        self.fetches = 0  # requests sent to rank 0
        self._lock = asyncio.Lock()
        self._kept: tuple[str, float, bytes] | None = None  # launch id, when, text

    async def text(self, view: ClusterView, client: aiohttp.ClientSession | None) -> bytes:
        """Rank 0's serving_* families; empty when no gang is ready or rank 0 fails to answer."""
        if client is None or view.state != GangState.READY:
            return b""
        upstream = await view.wait_for_upstream(0.0)
        if upstream is None:
            return b""
        async with self._lock:  # one fetch at a time; the others then find it kept
            kept = self._kept
            if kept and kept[0] == upstream.launch_id and self.clock() - kept[1] < self.cache_s:
                return kept[2]
            self.fetches += 1
            text = await _fetch(client, f"{upstream.url}/metrics", pinned_for(upstream.tls_cert))
            self._kept = (upstream.launch_id, self.clock(), text)
            return text


async def _fetch(client: aiohttp.ClientSession, url: str, ssl: SSLContext | bool) -> bytes:
    try:
        async with client.get(
            url, timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S), ssl=ssl
        ) as response:
            return await response.read() if response.status == 200 else b""
    except TRANSPORT_ERRORS:
        return b""
