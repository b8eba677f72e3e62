"""The status page in a real headless Chromium against one real 2-rank cluster, at a
phone's width: the tables, a chat, the live charts and the cluster drawing under load,
and a restart (its cause in the history, a mark on the charts).

The cluster serves the tiny random model: what is under test is the page (its text only
has to be words), and 2 ranks of it decode in milliseconds where 3 of SmolLM2 on 2 cores
take seconds a step."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.config import ClusterSpec, check_cluster_file
from orchestrator.loadgen.streams import chat_body, concurrent_streams
from orchestrator.status.links import record_linktest
from testkit.chromium import chromium
from testkit.orchestrator_process import (
    Orchestrator,
    gateway_status,
    running,
    write_cluster,
)
from testkit.status_page import shows_no_horizontal_scroll

pytestmark = pytest.mark.e2e
KEY = "page-key-1"
ENV = {"PAGE_TEST_KEY": KEY}
HEADERS = {"Authorization": f"Bearer {KEY}"}
PHONE = {"width": 375, "height": 812}
SSE_EVENTS = 2  # sample events timed for the rate (3 s apart by default)
# One sample event every 3 s is ~58 B/s (tests/orchestrator/gateway/test_charts.py); twice
# that would mean samples sent twice, or a sampling period halved.
SSE_MAX_B_PER_S = 116
# Tokens per stream of a load round: enough that the 3 s samples find requests running
# (the tiny model decodes a token in milliseconds); ending the load waits for one round.
ROUND_TOKENS = 200
RANKS = 2
MODEL_ID = "tiny"


@dataclass
class Cluster:
    orchestrator: Orchestrator
    config: Path
    url: str
    spec: ClusterSpec

    def kill_rank(self, rank: int) -> None:
        status = gateway_status(self.url, HEADERS)  # as `status --json`, without a CLI's start
        os.kill(int(status["ranks"][rank]["pid"]), signal.SIGKILL)

    @contextlib.contextmanager
    def output_on_failure(self) -> Iterator[None]:
        """The orchestrator's output with a failing test's report (the cluster outlives it)."""
        try:
            yield
        except BaseException:
            print("orchestrator output (last 150 lines):\n"
                  + "\n".join(self.orchestrator.output[-150:]))
            raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Cluster]:
    """2 local ranks of the tiny model behind an API key, no linktest on record yet;
    shared by the page's tests (each restart it causes ends READY again)."""
    tmp = tmp_path_factory.mktemp("page")
    nodes = [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(RANKS)]
    config = write_cluster(
        tmp, str(tiny_model_dir), nodes,
        model={"id": MODEL_ID},
        api={"api_key_env": "PAGE_TEST_KEY"},
        supervisor={"standby_ranks": False, "backoff_initial_s": 1.0},
    )
    spec, _ = check_cluster_file(config)
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, ENV, url) as orchestrator:
        yield Cluster(orchestrator, config, url, spec)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One Chromium for the module's tests: each opens its own page (a fresh context)."""
    with chromium() as launched:
        yield launched


def keep_screenshots(shots: Path, name: str) -> None:
    artifacts = Path(os.environ.get("ORCHESTRATOR_TEST_ARTIFACTS", shots.parent / "kept"))
    shutil.copytree(shots, artifacts / name, dirs_exist_ok=True)


def open_page(browser: Any, url: str, viewport: dict[str, int]) -> Any:
    """The page at `viewport`, given the key it asks for (/status wants it), READY."""
    page = browser.new_page(viewport=viewport)
    page.goto(f"{url}/")
    page.fill("#key", KEY)
    page.click("#key-form button")
    page.wait_for_function("document.getElementById('state').textContent === 'READY'")
    return page


# The chat log holds "> prompt\n" then the streamed answer: true once that has 3 words
# of letters and the log no "[error]" line.
ANSWERED = """asked => {
  const log = document.getElementById('chat-log').textContent;
  const answer = log.startsWith(asked) ? log.slice(asked.length) : '';
  const words = answer.split(/\\s+/).filter(w => /\\p{L}/u.test(w));
  return words.length >= 3 && !log.includes('[error]');
}"""


@contextlib.contextmanager
def load(url: str) -> Iterator[list[int]]:
    """Rounds of 3 concurrent streamed chats through the gateway, until the block ends;
    yields [rounds done, streams failed]."""
    counts, stop = [0, 0], threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            bodies = [chat_body(MODEL_ID, f"[{counts[0]}-{i}] Tell a story.",
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


def sse_bytes_per_second(url: str, events: int) -> float:
    """What one watching page receives from /status/live, per second, past its history:
    the bytes of `events` sample events over the time from the one before them to the
    last (so the rate is one of whole sampling periods, not of a window's edges)."""
    with httpx.stream("GET", f"{url}/status/live", headers=HEADERS, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        chunks = reply.iter_bytes()
        next(chunks)  # the history: once per page load
        next(chunks)  # the first sample: the clock starts at its arrival
        start, received = time.monotonic(), 0
        for _ in range(events):
            received += len(next(chunks))
        return received / (time.monotonic() - start)


@pytest.mark.timeout(600)
def test_the_page_shows_the_cluster_chats_charts_load_and_follows_a_restart(
    browser: object, cluster: Cluster, tmp_path: Path
) -> None:
    """At 375 px, no horizontal scroll: asks for the key, shows 2 nodes, 2 ranks and READY,
    streams a chat answer; the drawing shows 2 nodes, their share and the linktest's GB/s;
    tokens/s, TTFT and running requests go up while requests run and the canvases change;
    a killed worker shows as the restart, its cause in the history, a restart mark on the
    charts, and READY again. (One page and one restart for all of it: each restart is a
    cold launch of 2 ranks.)"""
    url = cluster.url
    shots = tmp_path / "screenshots"
    shots.mkdir()
    # /status/live's rate is measured while the page is looked at (one sample every 3 s:
    # waiting for them alone took ~8 s); asserted at the end.
    rates: list[float] = []
    rate_thread = threading.Thread(
        target=lambda: rates.append(sse_bytes_per_second(url, SSE_EVENTS)), daemon=True)
    with cluster.output_on_failure():
        rate_thread.start()
        page = open_page(browser, url, PHONE)
        assert page.locator("#nodes tbody tr").count() == RANKS
        assert page.locator("#ranks tbody tr").count() == RANKS
        assert page.locator("#ranks tbody").inner_text().count("running") == RANKS
        page.screenshot(path=str(shots / "ready.png"), full_page=True)
        chat(page)
        page.screenshot(path=str(shots / "chat.png"), full_page=True)
        # A sampled answer can hold a word wider than a phone (a URL, a row of dashes): it
        # wraps. (The answer above streams on while the test goes on.)
        page.evaluate("document.getElementById('chat-log').textContent += '_'.repeat(300)")
        assert shows_no_horizontal_scroll(page)

        page.wait_for_function("samples.length >= 2", timeout=30_000)  # the SSE stream flows
        drawing = page.locator("#drawing").inner_html()
        assert drawing.count("<rect") == RANKS and "not measured" in drawing
        assert f"1/{RANKS} of every layer" in drawing
        record_linktest(cluster.spec, [("n0", "n1", 1.234)])  # as a linktest leaves it
        page.wait_for_function(  # the next /status poll draws the figure on the cable
            "document.getElementById('drawing').innerHTML.includes('1.23 GB/s')",
            timeout=30_000)
        drawing = page.locator("#drawing").inner_html()
        assert "not measured" not in drawing and drawing.count("<rect") == RANKS
        idle = page.evaluate("document.querySelector('#chart-tps canvas').toDataURL()")
        assert shows_no_horizontal_scroll(page)
        page.screenshot(path=str(shots / "charts-idle.png"), full_page=True)

        before = page.evaluate("samples.length")  # the history holds the chat above
        with load(url) as counts:
            page.wait_for_function(
                "n => { const s = samples.slice(n); return s.some((p) => p.tokens_per_s > 0)"
                " && s.some((p) => p.running > 0) && s.some((p) => p.ttft_p50_s > 0); }",
                arg=before, timeout=180_000)
            next_sample_drawn(page)
            page.screenshot(path=str(shots / "charts-load.png"), full_page=True)
        assert counts[0] >= 1 and counts[1] == 0  # rounds done, streams failed
        busy = page.evaluate("document.querySelector('#chart-tps canvas').toDataURL()")
        assert busy != idle
        assert "tokens/s" in page.locator("#chart-tps figcaption").inner_text()
        assert shows_no_horizontal_scroll(page)

        rate_thread.join(60)
        status_bytes = len(httpx.get(f"{url}/status", headers=HEADERS).content)
        print(f"\nSSE /status/live: {rates} B/s; /status poll: {status_bytes} B every 2 s "
              f"({status_bytes / 2:.0f} B/s)")
        assert len(rates) == 1 and 0 < rates[0] < SSE_MAX_B_PER_S, rates

        marked, sampled = page.evaluate("[marks.length, samples.length]")
        cluster.kill_rank(1)
        page.wait_for_function("document.getElementById('state').textContent !== 'READY'")
        page.screenshot(path=str(shots / "restarting.png"), full_page=True)
        page.wait_for_function("n => marks.length > n", arg=marked, timeout=60_000)
        page.wait_for_function("n => samples.slice(n).some((p) => p.state !== 'ready')",
                               arg=sampled, timeout=60_000)
        page.wait_for_function(
            "document.getElementById('state').textContent === 'READY'", timeout=240_000)
        history = page.locator("#history tbody").inner_text()
        assert "rank_crashed" in history and "SIGKILL" in history
        next_sample_drawn(page)
        page.screenshot(path=str(shots / "ready-again.png"), full_page=True)
    keep_screenshots(shots, "page")


def chat(page: Any) -> None:
    """A question typed and sent: answered 200, its words streamed under it, no error."""
    prompt = "What is the capital of France?"
    with page.expect_response(
        lambda r: r.url.endswith("/v1/chat/completions"), timeout=120_000
    ) as replied:
        page.fill("#prompt", prompt)
        page.click("#chat-form button")
    assert replied.value.status == 200, replied.value.text()
    # Words of the answer under the prompt, and no "[error] ..." line of the page's own.
    page.wait_for_function(ANSWERED, arg=f"> {prompt}\n", timeout=120_000)
    assert "[error]" not in page.locator("#chat-log").inner_text()


def next_sample_drawn(page: Any) -> None:
    """Until /status/live pushes a sample newer than the page's last (drawn as it comes):
    one interval at most, where a fixed wait would take the longest every time."""
    last = page.evaluate("samples.length ? samples[samples.length - 1].t : 0")
    page.wait_for_function("t => samples.length > 0 && samples[samples.length - 1].t > t",
                           arg=last, timeout=30_000)
