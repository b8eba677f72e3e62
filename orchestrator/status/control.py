"""`status`, `down` and `restart`: talk to a running orchestrator found through its state file."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import msgspec

from orchestrator.config import ClusterSpec, check_cluster_file
from orchestrator.launch.stale_ranks import end_stale_ranks
from orchestrator.state_file import (
    ClusterState,
    orchestrator_alive,
    read_state,
    remove_state,
    state_path,
)
from orchestrator.status.model import ClusterStatus
from orchestrator.status.orphans import end_orphaned_gangs, orphan_report
from orchestrator.status.view import print_status
from orchestrator.transports.pool import NodePool

EXIT_READY, EXIT_STARTING, EXIT_DOWN = 0, 1, 2


def status(config: Path, as_json: bool) -> int:
    spec, _ = check_cluster_file(config)
    state = read_state(state_path(spec))
    if state is not None and not orchestrator_alive(state) and not as_json:
        print(asyncio.run(orphan_report(spec)))  # a crashed run's agents may serve on
        return EXIT_DOWN
    if state is None or not orchestrator_alive(state):
        _say_not_running(spec.cluster.name, as_json)
        return EXIT_DOWN
    snapshot = _fetch_status(state)
    if isinstance(snapshot, Unavailable):
        _say_not_running(spec.cluster.name, as_json, snapshot.reason, snapshot.state)
        return snapshot.exit_code
    if as_json:
        print(msgspec.json.format(msgspec.json.encode(snapshot)).decode())
    else:
        print_status(snapshot)
    if snapshot.state == "ready":
        return EXIT_READY
    return EXIT_DOWN if snapshot.state in ("failed", "stopped") else EXIT_STARTING


class Unavailable(NamedTuple):
    reason: str
    state: str
    exit_code: int


def _fetch_status(state: ClusterState) -> ClusterStatus | Unavailable:
    """The running orchestrator's snapshot, or why it could not be had."""
    key = os.environ.get(state.api_key_env) if state.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    where = f"orchestrator pid {state.orchestrator_pid} at {state.api_url}"
    try:
        response = httpx.get(f"{state.api_url}/status", headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        # It runs (its PID is alive) but its gateway is not up yet: connecting or preflight.
        return Unavailable(f"{where} is starting ({exc})", "starting", EXIT_STARTING)
    if response.status_code == 401:
        reason = f"{where} wants the API key: set ${state.api_key_env} in this shell"
        return Unavailable(reason, "unknown", EXIT_DOWN)
    if response.status_code != 200:
        return Unavailable(f"{where} answered {response.status_code}", "unknown", EXIT_DOWN)
    return msgspec.json.decode(response.content, type=ClusterStatus)


def _say_not_running(
    cluster: str, as_json: bool, why: str = "not running", state: str = "not_running"
) -> None:
    if as_json:
        print(msgspec.json.encode({"cluster": cluster, "state": state, "reason": why}).decode())
    else:
        print(f"{cluster}: {why}")


def down(config: Path, timeout_s: float = 120.0, keep_ranks: bool = False) -> int:
    """Ask the orchestrator to stop gracefully; if it is gone, end its recorded ranks ourselves.
    With keep_ranks, only the orchestrator exits: the ranks serve on, for a new `up` to adopt."""
    spec, _ = check_cluster_file(config)
    path = state_path(spec)
    state = read_state(path)
    if state is None:
        print(f"{spec.cluster.name}: not running")
        return 0
    if keep_ranks and not _can_keep_ranks(spec, state):
        return EXIT_DOWN
    if orchestrator_alive(state):
        os.kill(state.orchestrator_pid, signal.SIGUSR1 if keep_ranks else signal.SIGTERM)
        print(f"{spec.cluster.name}: asked orchestrator pid {state.orchestrator_pid} to "
              + ("exit, leaving the ranks serving" if keep_ranks else "stop"))
        deadline = time.monotonic() + timeout_s
        while orchestrator_alive(state):
            if time.monotonic() > deadline:
                print(
                    f"orchestrator pid {state.orchestrator_pid} still runs after {timeout_s:g} s",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.2)
        print(f"{spec.cluster.name}: " + (
            f"orchestrator exited; the ranks serve on for up to "
            f"{spec.supervisor.orphan_grace_s:g} s: `orchestrator up {config}` adopts them "
            f"(no model load), `orchestrator down {config}` ends them" if keep_ranks
            else "stopped"))
        return 0
    ended = asyncio.run(_end_recorded_ranks(spec, state))
    remove_state(path)
    print(f"{spec.cluster.name}: orchestrator was gone; ended {ended} leftover rank(s)")
    return 0


def _can_keep_ranks(spec: ClusterSpec, state: ClusterState) -> bool:
    if not orchestrator_alive(state):
        print(f"{spec.cluster.name}: no orchestrator is running; its ranks, if any, serve "
              f"until `orchestrator up` adopts them or their orphan grace ends", file=sys.stderr)
        return False
    if spec.supervisor.orphan_grace_s <= 0:
        print(f"{spec.cluster.name}: [supervisor] orphan_grace_s is 0, so the agents end "
              f"their ranks when the orchestrator exits; set it (seconds) and `up` again to "
              f"use --keep-ranks", file=sys.stderr)
        return False
    return True


async def _end_recorded_ranks(spec: ClusterSpec, state: ClusterState) -> int:
    pool = NodePool(spec, on_event=lambda node, event: None, on_lost=lambda node, info: None)
    try:
        await pool.connect_all()
        return await end_stale_ranks(pool, state.ranks) + await end_orphaned_gangs(pool)
    finally:
        await pool.close_all()


def restart(config: Path) -> int:
    """SIGHUP: a fresh restart budget, and a relaunch if the cluster had failed."""
    spec, _ = check_cluster_file(config)
    state = read_state(state_path(spec))
    if state is None or not orchestrator_alive(state):
        print(f"{spec.cluster.name}: not running", file=sys.stderr)
        return EXIT_DOWN
    os.kill(state.orchestrator_pid, signal.SIGHUP)
    print(f"{spec.cluster.name}: restart requested")
    return 0
