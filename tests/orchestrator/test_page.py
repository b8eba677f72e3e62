"""The status page in a real headless Chromium against a real 3-rank cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.chromium import chromium
from testkit.orchestrator_process import run_cli, running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
KEY = "page-key-1"


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


def test_the_page_shows_the_cluster_chats_and_follows_a_restart(
    browser: object, tmp_path: Path, bundled_model_dir: Path
) -> None:
    """Asks for the key, shows 3 nodes, 3 ranks and READY, streams a chat answer, and after
    a worker is killed shows the restart, its cause, and READY again."""
    nodes = [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(3)]
    config = write_cluster(
        tmp_path, "bundled:smollm2-135m-instruct", nodes,
        api={"api_key_env": "PAGE_TEST_KEY"},
        supervisor={"standby_ranks": False, "backoff_initial_s": 1.0},
    )
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    env = {"PAGE_TEST_KEY": KEY}
    with running(config, env, url):
        page = browser.new_page(viewport={"width": 390, "height": 844})  # type: ignore[attr-defined]
        page.goto(f"{url}/")
        page.fill("#key", KEY)  # /status wants the key: the page asks for it
        page.click("#key-form button")
        page.wait_for_function("document.getElementById('state').textContent === 'READY'")
        assert page.locator("#nodes tbody tr").count() == 3
        assert page.locator("#ranks tbody tr").count() == 3
        assert page.locator("#ranks tbody").inner_text().count("running") == 3
        page.screenshot(path=str(shots / "ready.png"), full_page=True)

        prompt = "What is the capital of France?"
        with page.expect_response(  # type: ignore[attr-defined]
            lambda r: r.url.endswith("/v1/chat/completions"), timeout=120_000
        ) as replied:
            page.fill("#prompt", prompt)
            page.click("#chat-form button")
        assert replied.value.status == 200, replied.value.text()
        # Words of the answer under the prompt, and no "[error] ..." line of the page's own.
        page.wait_for_function(ANSWERED, arg=f"> {prompt}\n", timeout=120_000)
        assert "[error]" not in page.locator("#chat-log").inner_text()
        page.screenshot(path=str(shots / "chat.png"), full_page=True)

        status = json.loads(run_cli("status", str(config), "--json", env=env).stdout)
        os.kill(int(status["ranks"][1]["pid"]), signal.SIGKILL)
        page.wait_for_function("document.getElementById('state').textContent !== 'READY'")
        page.screenshot(path=str(shots / "restarting.png"), full_page=True)
        page.wait_for_function(
            "document.getElementById('state').textContent === 'READY'", timeout=180_000
        )
        history = page.locator("#history tbody").inner_text()
        assert "rank_crashed" in history and "SIGKILL" in history
        page.screenshot(path=str(shots / "ready-again.png"), full_page=True)
    artifacts = Path(os.environ.get("ORCHESTRATOR_TEST_ARTIFACTS", tmp_path / "kept"))
    shutil.copytree(shots, artifacts / "page", dirs_exist_ok=True)


# The chat log holds "> prompt\n" then the streamed answer: true once that has 3 words
# of letters and the log no "[error]" line.
ANSWERED = """asked => {
  const log = document.getElementById('chat-log').textContent;
  const answer = log.startsWith(asked) ? log.slice(asked.length) : '';
  const words = answer.split(/\\s+/).filter(w => /\\p{L}/u.test(w));
  return words.length >= 3 && !log.includes('[error]');
}"""
