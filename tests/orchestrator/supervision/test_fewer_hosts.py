"""Two namespace hosts in pipeline mode; host 1 goes to sleep past node_wait_s: the gang is
re-planned on host 0 alone and serves the same greedy text; host 1 wakes: the full
placement is back, no request lost during the switch, no restart spent."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.asleep import freeze, thaw
from testkit.load import Load
from testkit.netns import HostsFactory
from testkit.orchestrator_process import run_cli, running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

NODE_WAIT_S = 2.0
REQUEST_TIMEOUT_S = 60.0
SETTINGS: dict[str, dict[str, Any]] = {
    "cluster": {"parallel": "pipeline"},
    "serving": {"request_timeout_s": REQUEST_TIMEOUT_S},
    "supervisor": {"node_wait_s": NODE_WAIT_S, "stop_grace_s": 2.0, "standby_ranks": False,
                   "backoff_initial_s": 0.5, "launch_timeout_s": 120.0},
}


def complete(client: httpx.Client, url: str, model: str) -> str:
    reply = client.post(f"{url}/v1/completions", json={
        "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
    })
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def until_status(
    client: httpx.Client, url: str, check: Callable[[dict[str, Any]], bool], limit_s: float
) -> dict[str, Any]:
    """/status once `check(status)` holds (polled every 0.2 s); fails at once on `failed`."""
    deadline, seen = time.monotonic() + limit_s, dict[str, Any]()
    while time.monotonic() < deadline:
        try:
            seen = client.get(f"{url}/status").json()
        except (httpx.HTTPError, ValueError):
            seen = {}
        if seen and check(seen):
            return seen
        assert seen.get("state") != "failed", seen
        time.sleep(0.2)
    raise AssertionError(f"status never matched: {seen}")


def test_a_host_away_past_node_wait_s_leaves_the_other_serving_then_both_again(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """h1 frozen: `on 1 of 2 nodes, without h1` within node_wait_s plus detection and one
    launch, same greedy text as the 2-stage pipeline; h1 thawed: back on h0 and h1, every
    request during the switch answered, no restart spent."""
    net = netns_hosts(2, "switch")
    config = write_cluster(tmp_path, str(tiny_model_dir), [net.node(0), net.node(1)],
                           **SETTINGS)
    api = tomllib.loads(config.read_text())["api"]
    url, model = f"http://{api['host']}:{api['port']}", tiny_model_dir.name
    with running(config, url=url) as orchestrator, httpx.Client(timeout=120) as client:
        full = complete(client, url, model)
        frozen_at = time.monotonic()
        pids = freeze(net, 1)
        try:
            fewer = until_status(client, url, lambda s: s["state"] == "ready"
                                 and "on 1 of 2 nodes, without h1" in s["reason"], 120)
            fewer_at = time.monotonic()
            assert complete(client, url, model) == full
            served_at = time.monotonic()
        finally:
            thaw(net, 1, pids)
        woke_at = time.monotonic()
        with Load(url, model, REQUEST_TIMEOUT_S) as load:
            back = until_status(client, url, lambda s: s["state"] == "ready"
                                and s["launch_id"] != fewer["launch_id"], 120)
            back_at = time.monotonic()
            time.sleep(1.0)  # a few requests on the restored gang
        assert complete(client, url, model) == full
        print(f"\nfewer hosts: serving on h0 alone {fewer_at - frozen_at:.1f} s after h1 froze "
              f"(node_wait_s {NODE_WAIT_S:g}), first answer {served_at - frozen_at:.1f} s; "
              f"back on both {back_at - woke_at:.1f} s after h1 woke; "
              f"{len(load.outcomes)} requests during the switch")
        for at, line in orchestrator.lines:  # the timeline, shown with -s
            if at > frozen_at and any(k in line for k in ("state ", "failure:", "unreachable")):
                print(f"  {at - frozen_at:6.1f} s  {line[-160:]}")
        assert "of 2 nodes" not in back["reason"], back
        assert [r["node"] for r in back["ranks"]] == ["h0", "h1"], back
        assert back["restarts"] == 0, back
        assert load.hung() == [] and load.outcomes
        assert {o.result for o in load.outcomes} == {"ok"}, load.outcomes
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
