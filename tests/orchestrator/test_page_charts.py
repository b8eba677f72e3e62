"""The status page's live charts and cluster drawing, in a real headless Chromium at a
phone's width, against a real 3-rank cluster under load."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.config import check_cluster_file
from orchestrator.loadgen.streams import chat_body, concurrent_streams
from orchestrator.status.links import record_linktest
from testkit.chromium import chromium
from testkit.orchestrator_process import run_cli, running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
KEY = "charts-key-1"
ENV = {"CHARTS_TEST_KEY": KEY}
HEADERS = {"Authorization": f"Bearer {KEY}"}
PHONE = {"width": 375, "height": 812}
SSE_WATCH_S = 6.0  # the rate's bound only; the figure itself: the bench's job
# Tokens per stream of a load round: a round spans several 3 s samples at 3 oversubscribed
# ranks, and ending the load waits for the round under way (48 tokens: over a minute).
ROUND_TOKENS = 12


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


@contextlib.contextmanager
def load(url: str) -> Iterator[list[int]]:
    """Rounds of 3 concurrent streamed chats through the gateway, until the block ends;
    yields [rounds done, streams failed]."""
    counts, stop = [0, 0], threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            bodies = [chat_body("smollm2-135m-instruct", f"[{counts[0]}-{i}] Tell a story.",
                                ROUND_TOKENS)
                      for i in range(3)]
            times, _wall = concurrent_streams(url, bodies, headers=HEADERS, timeout_s=300)
            counts[0] += 1
            counts[1] += sum(1 for t in times if t.error)

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(300)


def sse_bytes_per_second(url: str, seconds: float) -> float:
    """What one watching page receives from /status/live, per second, past its history."""
    received = 0
    with httpx.stream("GET", f"{url}/status/live", headers=HEADERS, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        chunks = reply.iter_bytes()
        next(chunks)  # the history: once per page load
        start = time.monotonic()
        for chunk in chunks:
            received += len(chunk)
            if time.monotonic() - start > seconds:
                break
        return received / (time.monotonic() - start)


def test_charts_move_under_load_and_mark_a_restart(
    browser: object, tmp_path: Path, bundled_model_dir: Path
) -> None:
    """At 375 px: no horizontal scroll; the drawing shows 3 nodes, their share and the
    linktest's GB/s; tokens/s, TTFT and running requests go up while requests run and the
    canvases change; a killed rank appears as a restart mark."""
    nodes = [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(3)]
    config = write_cluster(
        tmp_path, "bundled:smollm2-135m-instruct", nodes,
        api={"api_key_env": "CHARTS_TEST_KEY"},
        supervisor={"standby_ranks": False, "backoff_initial_s": 1.0},
    )
    spec, _ = check_cluster_file(config)
    record_linktest(spec, [("n0", "n1", 1.234)])  # as a linktest leaves it
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with running(config, ENV, url):
        page = browser.new_page(viewport=PHONE)  # type: ignore[attr-defined]
        page.goto(f"{url}/")
        page.fill("#key", KEY)
        page.click("#key-form button")
        page.wait_for_function("document.getElementById('state').textContent === 'READY'")
        page.wait_for_function("samples.length >= 2", timeout=30_000)  # the SSE stream flows
        drawing = page.locator("#drawing").inner_html()
        assert drawing.count("<rect") == 3 and "1.23 GB/s" in drawing
        assert "not measured" in drawing and "1/3 of every layer" in drawing
        idle = page.evaluate("document.querySelector('#chart-tps canvas').toDataURL()")
        assert no_horizontal_scroll(page)
        page.screenshot(path=str(shots / "charts-idle.png"), full_page=True)

        with load(url) as counts:
            page.wait_for_function(
                "samples.some((p) => p.tokens_per_s > 0) && samples.some((p) => p.running > 0)"
                " && samples.some((p) => p.ttft_p50_s > 0)", timeout=180_000)
            page.wait_for_timeout(4000)  # one more sample drawn
            page.screenshot(path=str(shots / "charts-load.png"), full_page=True)
        assert counts[0] >= 1 and counts[1] == 0  # rounds done, streams failed
        busy = page.evaluate("document.querySelector('#chart-tps canvas').toDataURL()")
        assert busy != idle
        assert "tokens/s" in page.locator("#chart-tps figcaption").inner_text()
        assert no_horizontal_scroll(page)

        rate = sse_bytes_per_second(url, SSE_WATCH_S)
        status_bytes = len(httpx.get(f"{url}/status", headers=HEADERS).content)
        print(f"\nSSE /status/live: {rate:.0f} B/s; /status poll: {status_bytes} B every 2 s "
              f"({status_bytes / 2:.0f} B/s)")
        assert 0 < rate < 1000

        status = json.loads(run_cli("status", str(config), "--json", env=ENV).stdout)
        os.kill(int(status["ranks"][1]["pid"]), signal.SIGKILL)
        page.wait_for_function("marks.length >= 1", timeout=60_000)
        page.wait_for_function("samples.some((p) => p.state !== 'ready')", timeout=60_000)
        page.wait_for_function(
            "document.getElementById('state').textContent === 'READY'", timeout=240_000)
        page.wait_for_timeout(4000)
        page.screenshot(path=str(shots / "charts-restart.png"), full_page=True)
    artifacts = Path(os.environ.get("ORCHESTRATOR_TEST_ARTIFACTS", tmp_path / "kept"))
    shutil.copytree(shots, artifacts / "page-charts", dirs_exist_ok=True)


def no_horizontal_scroll(page: object) -> bool:
    return bool(page.evaluate(  # type: ignore[attr-defined]
        "document.documentElement.scrollWidth <= window.innerWidth"))
