"""Agents outlive their orchestrator: a new `up` adopts the running gang, no model load."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.netns import HostsFactory, MultiHost
from testkit.orchestrator_process import (
    Orchestrator,
    gateway_status,
    kill_all,
    run_cli,
    wait_gone,
    write_cluster,
)
from testkit.wire import capture

pytestmark = pytest.mark.e2e

BUNDLED = "bundled:smollm2-135m-instruct"
LOCAL2 = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(2)]
BODY = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}


def _url(config: Path) -> str:
    import tomllib

    api = tomllib.loads(config.read_text())["api"]
    return f"http://{api['host']}:{api['port']}"


def _pids(url: str) -> dict[int, int]:
    """Each rank's PID from the gateway's /status (what `status --json` prints, without a
    CLI's start: `status` itself is run below where no orchestrator answers)."""
    return {rank["rank"]: rank["pid"] for rank in gateway_status(url)["ranks"]}



@pytest.fixture
def leftovers() -> Iterator[set[int]]:
    """PIDs a test's orchestrators left (agents and ranks outlive a SIGKILL): ended at the end."""
    pids: set[int] = set()
    yield pids
    kill_all(pids)


def _request(url: str, max_tokens: int) -> str:
    """ok, failed (an error or a closed connection) or hung (no answer within 30 s)."""
    try:
        response = httpx.post(f"{url}/v1/completions", json={**BODY, "max_tokens": max_tokens},
                              timeout=30)
    except httpx.TimeoutException:
        return "hung"
    except httpx.HTTPError:
        return "failed"
    return "ok" if response.status_code == 200 else "failed"


def _kill_under_load(first: Orchestrator, url: str, leftovers: set[int]) -> dict[str, int]:
    """SIGKILL the orchestrator with requests in flight; how each of them ended."""
    leftovers |= first.remember_descendants()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        flights = [pool.submit(_request, url, 64) for _ in range(4)]
        time.sleep(1.0)
        first.process.kill()
        first.wait_exit()
        outcomes = [flight.result() for flight in flights]
    return {kind: outcomes.count(kind) for kind in ("ok", "failed", "hung")}


def test_up_adopts_the_gang_after_kill_9(tmp_path: Path, leftovers: set[int]) -> None:
    """kill -9 of `up` under load: in-flight requests fail (none hangs), `status` tells of
    the orphaned gang; a new `up` serves within seconds on the very rank processes (no
    launch, no model load) and every request then succeeds. `down --keep-ranks` ends only
    the orchestrator; then `down` with no orchestrator running reaches the agents and ends
    ranks and agents."""
    # The bundled model, 2 ranks (pipeline): the full launch timed is a real model load.
    # Standby ranks (2 MLX imports) would compete for the cores with the requests timed.
    config = write_cluster(tmp_path, BUNDLED, LOCAL2, model={"id": "tiny"},
                           supervisor={"orphan_grace_s": 60.0, "standby_ranks": False})
    url = _url(config)
    started = time.monotonic()
    first = Orchestrator(config)
    second: Orchestrator | None = None
    try:
        first.wait_ready(url)
        relaunch_s = time.monotonic() - started
        before = _pids(url)
        around_kill = _kill_under_load(first, url, leftovers)
        assert around_kill["hung"] == 0, around_kill
        t = time.monotonic()
        orphaned = run_cli("status", str(config)).stdout
        print(f"status with no orchestrator: {time.monotonic() - t:.1f} s")
        assert "no orchestrator; gang of 2 ranks serving, orphaned since" in orphaned, orphaned
        started = time.monotonic()
        second = Orchestrator(config)
        second.wait_ready(url, timeout_s=60)
        adopt_s = time.monotonic() - started
        print(f"full launch {relaunch_s:.1f} s, adopted {adopt_s:.1f} s, "
              f"around the kill {around_kill}")
        assert _pids(url) == before
        assert "adopted launch" in second.text, second.text
        assert "rank 0 started" not in second.text and "ranks loaded" not in second.text
        t = time.monotonic()
        after = [_request(url, 4) for _ in range(6)]
        assert after == ["ok"] * 6, after
        print(f"6 requests after adoption: {time.monotonic() - t:.1f} s")
        assert adopt_s < relaunch_s, (adopt_s, relaunch_s)
        # The upgrade path: only the orchestrator exits; the gang serves on, orphaned.
        kept = run_cli("down", str(config), "--keep-ranks")
        assert kept.returncode == 0 and "the ranks serve on" in kept.stdout, kept
        assert second.wait_exit() == 0
        assert wait_gone(set(before.values()), timeout_s=1.0) == set(before.values())
        assert "orphaned since" in run_cli("status", str(config)).stdout
        t = time.monotonic()
        down = run_cli("down", str(config))
        assert down.returncode == 0 and "orchestrator was gone" in down.stdout, down
        print(f"down with no orchestrator: {time.monotonic() - t:.1f} s")
        assert wait_gone(set(before.values())) == set(), "`down` left ranks running"
        assert wait_gone(leftovers - set(before.values())) == set(), "`down` left agents"
    finally:
        if second is not None:
            second.stop()
        first.stop()


def test_up_adopts_across_namespace_hosts(netns_hosts: HostsFactory, tmp_path: Path,
                                          tiny_model_dir: Path, leftovers: set[int]) -> None:
    """2 SSH hosts: the gateway reaches rank 0 over TLS (no prompt on the wire); the agents
    outlive the SSH sessions of a SIGKILLed `up`; the next `up` reaches them through
    node_agent.channel.bridge, adopts the gang and pins its certificate; `down` ends it all."""
    net = netns_hosts(2, "switch")
    # The tiny model: what is adopted is the gang, whatever it loaded (the test above
    # times a real model's load).
    config = write_cluster(tmp_path, str(tiny_model_dir), [net.node(i) for i in range(2)],
                           model={"id": "tiny"},
                           supervisor={"standby_ranks": False, "orphan_grace_s": 60.0})
    url = _url(config)
    first = Orchestrator(config)
    second: Orchestrator | None = None
    try:
        first.wait_ready(url)
        assert_hop_encrypted(net, config, url)
        before = _pids(url)
        first.process.kill()
        first.wait_exit()
        started = time.monotonic()
        second = Orchestrator(config)
        second.wait_ready(url, timeout_s=60)
        print(f"adopted across hosts in {time.monotonic() - started:.1f} s")
        assert _pids(url) == before
        assert "adopted launch" in second.text and "reached on its socket" in second.text
        assert [_request(url, 4) for _ in range(3)] == ["ok"] * 3
        assert run_cli("down", str(config)).returncode == 0
        assert second.wait_exit() == 0
    finally:
        if second is not None:
            second.stop()
        first.stop()
    assert net.only_sshd_left()


def assert_hop_encrypted(net: MultiHost, config: Path, url: str) -> None:
    """A prompt sent through the gateway crosses h0's link without its text in the bytes;
    the same text sent in the clear to rank 0's port is seen (the capture works)."""
    import tomllib

    port = tomllib.loads(config.read_text())["serving"]["rank_api_port"]
    marker = "quokka-marmalade-4242"
    body = {**BODY, "prompt": f"Say {marker}", "max_tokens": 2}
    with capture(f"{net.prefix}m0") as wire:
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    assert len(wire.data) > 1000  # the request and its answer crossed this link
    assert marker.encode() not in wire.data
    with (capture(f"{net.prefix}m0") as control,
          socket.create_connection((net.hosts[0].mgmt_ip, port), timeout=5) as clear):
        clear.sendall(f"POST / HTTP/1.1\r\nX: {marker}\r\n\r\n".encode())
        time.sleep(0.2)
    assert marker.encode() in control.data
