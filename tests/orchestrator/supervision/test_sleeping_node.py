"""A worker host that goes to sleep under load (every link down, every process stopped)
for ~20 s, then wakes: waited for, serving again, and not one restart spent."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.asleep import freeze, thaw
from testkit.load import Load
from testkit.netns import HostsFactory
from testkit.orchestrator_process import run_cli, running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

# Waiting shows ~6 s after the freeze (the links silent ~3 s, then the ping sent with the
# gang's stop goes unanswered 3 s: the stop and the recovery wait no longer for the frozen
# node; it was ~11.5 s while the stop waited 1 + 5 s and the recovery pinged again),
# later on a loaded machine: the host
# sleeps on for WAITING_S after that, five reconnects failing 2 s apart without a restart
# spent. The old behaviour spent one on the first and, with max_restarts = 2 and 0.5 s
# backoff, failed within ~5 s. (The figure was 60 s, then 30 s in all.)
WAITING_S = 10.0
ASLEEP_MAX_S = 90.0  # waiting never showing: fail then
REQUEST_TIMEOUT_S = 30.0
SETTINGS = {
    "serving": {"request_timeout_s": REQUEST_TIMEOUT_S},
    "supervisor": {
        "backoff_initial_s": 0.5,
        "stop_grace_s": 2.0,
        "launch_timeout_s": 120.0,
        "max_restarts": 2,  # the old behaviour would have failed it within WAITING_S
        "node_wait_s": 300.0,
        "standby_ranks": False,
    },
}
# During the absence a request may be resent, cut mid-stream (an error event), or answered
# 503 once held past the request timeout; never hung.
TOLERATED = {"ok", "sse_error:stream_interrupted", "sse_error:engine_error",
             "http_503:cluster_unavailable"}


def status(client: httpx.Client, url: str) -> dict[str, object]:
    try:
        return dict(client.get(f"{url}/status").json())
    except (httpx.HTTPError, ValueError):
        return {}


def restarts_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "orchestrator_restarts_total"
    )


def state_metric(url: str) -> str:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return next(
        sample.labels["orchestrator_state"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "orchestrator_state" and sample.value == 1
    )


def test_a_worker_asleep_is_waited_for_and_serves_again(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Host 1 frozen under load, still waited for WAITING_S after `waiting for node h1:
    unreachable since ...` shows in /status and /metrics; serving again once it wakes,
    restart budget untouched."""
    net = netns_hosts(2, "switch")
    config = write_cluster(tmp_path, str(tiny_model_dir), [net.node(0), net.node(1)],
                           **SETTINGS)
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url) as orchestrator, httpx.Client(timeout=5) as client:
        with Load(url, tiny_model_dir.name, REQUEST_TIMEOUT_S) as load:
            while not any(o.result == "ok" for o in load.outcomes):
                time.sleep(0.2)
            frozen_at = time.monotonic()
            pids = freeze(net, 1)
            try:
                waiting_at, seen = None, {}
                while time.monotonic() < (frozen_at + ASLEEP_MAX_S if waiting_at is None
                                          else waiting_at + WAITING_S):
                    seen = status(client, url)
                    if waiting_at is None and seen.get("state") == "waiting":
                        waiting_at = time.monotonic()
                        assert state_metric(url) == "waiting"
                        reason = str(seen["reason"])
                    time.sleep(0.2)
                assert waiting_at is not None, (seen, orchestrator.text[-3000:])
                assert seen.get("state") == "waiting", seen  # still, WAITING_S later
            finally:
                thaw(net, 1, pids)
            woke_at = time.monotonic()
            served_at = None
            while served_at is None and time.monotonic() < woke_at + 120:
                done = [o.ended for o in load.outcomes if o.started > woke_at and o.result == "ok"]
                served_at = min(done) if done else None
                time.sleep(0.1)
            assert served_at is not None, orchestrator.text[-3000:]
            time.sleep(1.0)  # a few requests on the new gang
        after = status(client, url)
        print(
            f"\nsleeping node: waiting {waiting_at - frozen_at:.1f} s after the freeze; "
            f"serving {served_at - woke_at:.1f} s after it woke; restarts spent "
            f"{after['restarts']:g} (metrics total {restarts_total(url):g})"
        )
        for at, line in orchestrator.lines:  # the timeline, shown with -s
            if at > frozen_at and any(k in line for k in ("state ", "failure:", "unreachable")):
                print(f"  {at - frozen_at:6.1f} s  {line[-160:]}")
        assert reason.startswith("waiting for node h1: unreachable since "), reason
        assert after["state"] == "ready" and after["restarts"] == 0, after
        assert restarts_total(url) == 0
        assert load.hung() == []
        results = {o.result for o in load.between(frozen_at, served_at)}
        assert results <= TOLERATED, results
        assert load.outcomes[-1].result == "ok"
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
