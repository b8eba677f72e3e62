"""The status page in a real headless Chromium against two `[[instances]]` (ids alpha and
beta, one rank of the tiny model each on a local node): each instance's row (name, model,
state) and its own series in the charts, load on alpha moving alpha's alone; a rank of
beta killed shows in beta's row while alpha's stays ready."""

from __future__ import annotations

import json
import os
import signal
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from orchestrator.loadgen.streams import chat_body, concurrent_streams
from testkit.chromium import chromium
from testkit.orchestrator_process import gateway_status, running, write_cluster
from testkit.ports import free_port_block
from testkit.status_page import open_status_page, shows_no_horizontal_scroll

pytestmark = pytest.mark.e2e
PHONE = {"width": 390, "height": 844}
NAMES = ("alpha", "beta")
TOKENS = 200  # per stream: enough that a 3 s sample finds alpha decoding


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[str]:
    """Instances alpha on n0 and beta on n1, each its own model id: the gateway's URL."""
    tmp = tmp_path_factory.mktemp("page-instances")
    config = write_cluster(
        tmp, str(tiny_model_dir), [{"name": "n0", "ip": "127.0.0.1"},
                                   {"name": "n1", "ip": "127.0.0.1"}],
        cluster={"rank_port": free_port_block(2)},
        serving={"rank_api_port": free_port_block(2)},
        supervisor={"standby_ranks": False, "backoff_initial_s": 0.2},
    )
    data = tomllib.loads(config.read_text())
    data["instances"] = [{"name": name, "model": str(tiny_model_dir), "id": name,
                          "nodes": [f"n{i}"]} for i, name in enumerate(NAMES)]
    config.write_text(tomli_w.dumps(data))
    address = f"http://{data['api']['host']}:{data['api']['port']}"
    with running(config, url=address):
        yield address


def load_alpha(url: str, stop: threading.Event) -> None:
    """Rounds of 2 streamed chats to alpha until `stop`."""
    round_ = 0
    while not stop.is_set():
        round_ += 1
        bodies = [chat_body("alpha", f"[{round_}-{i}] Tell a story.", TOKENS) for i in range(2)]
        concurrent_streams(url, bodies, timeout_s=120)


def row_states(page: Any) -> dict[str, str]:
    """The instances table: name -> state."""
    rows = page.evaluate("[...document.querySelectorAll('#instances tbody tr')]"
                         ".map((r) => [...r.cells].map((c) => c.textContent))")
    return {cells[0]: cells[4] for cells in rows}


@pytest.mark.timeout(300)
def test_each_instance_has_its_row_state_and_own_charts(url: str) -> None:
    """Both instances listed with their model and READY state, a chat to the model picked;
    tokens/s drawn per instance, alpha's up under its load and beta's not; beta's rank
    killed: its row leaves ready and comes back, alpha's stays ready throughout."""
    with chromium() as browser:
        page = open_status_page(browser, url, PHONE)
        page.wait_for_function("document.querySelectorAll('#instances tbody tr').length === 2")
        assert page.locator("#instances-part").is_visible()
        assert row_states(page) == {"alpha": "ready", "beta": "ready"}
        table = page.locator("#instances tbody").inner_text()
        assert "n0" in table and "n1" in table
        assert page.locator("#ranks tbody").inner_text().count("\u00b7 0") == 2
        assert page.evaluate("[...document.getElementById('chat-model').options]"
                             ".map((o) => o.value)") == list(NAMES)

        page.wait_for_function("samples.length >= 1", timeout=30_000)
        before = page.evaluate("samples.length")
        stop = threading.Event()
        loader = threading.Thread(target=load_alpha, args=(url, stop), daemon=True)
        loader.start()
        try:
            page.wait_for_function(
                "n => samples.slice(n).some((p) => p.instances && p.instances.alpha"
                " && p.instances.alpha.tokens_per_s > 0)", arg=before, timeout=120_000)
        finally:
            stop.set()
            loader.join(120)
        figures = page.evaluate("n => samples.slice(n).map((p) => p.instances)", before)
        assert all(set(point) == set(NAMES) for point in figures)
        assert not any(point["beta"].get("tokens_per_s") for point in figures)
        legend = page.locator("#chart-tps figcaption").inner_text()
        assert "alpha" in legend and "beta" in legend
        requests = page.locator("#chart-requests figcaption").inner_text()
        assert "alpha running" in requests and "beta waiting" in requests
        assert shows_no_horizontal_scroll(page)

        with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions"),
                                  timeout=60_000) as replied:
            page.select_option("#chat-model", "beta")
            page.fill("#prompt", "Hello?")
            page.click("#chat-form button")
        assert replied.value.status == 200, replied.value.text()
        assert json.loads(replied.value.request.post_data or "{}")["model"] == "beta"

        pid = {i["name"]: i for i in gateway_status(url)["instances"]}["beta"]["ranks"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        page.wait_for_function(
            "[...document.querySelectorAll('#instances tbody tr')].some("
            "(r) => r.cells[0].textContent === 'beta' && r.cells[4].textContent !== 'ready')",
            timeout=30_000)
        assert row_states(page)["alpha"] == "ready"
        assert page.locator("#state").inner_text() == "READY"  # alpha serves on
        page.wait_for_function(
            "[...document.querySelectorAll('#instances tbody tr')].every("
            "(r) => r.cells[4].textContent === 'ready')", timeout=120_000)
        assert row_states(page) == {"alpha": "ready", "beta": "ready"}
