"""`/metrics` at the gateway: a scrape flood reaches rank 0 at most once per cache period."""

from __future__ import annotations

import time

import httpx

from orchestrator.gateway import app as gateway_app
from orchestrator.gateway.rank0_metrics import CACHE_S
from orchestrator.supervision.metrics import OrchestratorMetrics
from testkit.fake_rank0 import FakeView, fake_rank0, status
from testkit.raw_http import on_uvicorn

SCRAPE_S = 3.0


def test_a_scrape_flood_reaches_rank_0_at_the_cache_rate() -> None:
    """100 scrapes a second for 3 s: each answers with rank 0's families, and rank 0 is
    asked at most once per CACHE_S (plus the first)."""
    asked: list[float] = []

    def rank0(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/metrics"):
            asked.append(time.monotonic())
            return httpx.Response(200, text="serving_steps_total 7.0\n")
        return httpx.Response(404)

    view = FakeView()
    with fake_rank0(rank0) as base:
        view.base_url = base
        app = gateway_app.create_app(view, status, OrchestratorMetrics(), api_key=None,
                                     request_timeout_s=5.0)
        with on_uvicorn(app) as (host, port), httpx.Client(timeout=5) as client:
            scrapes, start = 0, time.monotonic()
            while (elapsed := time.monotonic() - start) < SCRAPE_S:
                reply = client.get(f"http://{host}:{port}/metrics")
                assert reply.status_code == 200 and "serving_steps_total 7.0" in reply.text
                scrapes += 1
                time.sleep(max(0.0, scrapes / 100 - elapsed))
    assert 1 <= len(asked) <= SCRAPE_S / CACHE_S + 1
    assert scrapes >= 100  # about 300: the flood was one
