"""A node that goes away (a Mac asleep): waited for without spending restarts, on a fake
clock with scripted answers; and which connection errors count as away, on real ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.config.load import check_cluster_data
from orchestrator.supervision import gang_stop
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.node_wait import NodeAnswers
from orchestrator.supervision.state import GangState
from orchestrator.supervision.waits import NODE_RETRY_S
from orchestrator.transports import AgentExit, ErrorKind, TransportError
from orchestrator.transports.pool import NodePool
from testkit.ports import free_port
from testkit.supervisor_harness import Harness, sample, stop

ASLEEP = "timeout: no answer from 10.0.0.3:22 in time"


def waiting_for_c(h: Harness) -> bool:
    return h.supervisor.view.state == GangState.WAITING and "node c" in h.supervisor.view.reason


def state_metric(h: Harness, state: str) -> float:
    return sample(h.metrics, "orchestrator_state", orchestrator_state=state)


async def test_a_node_that_goes_away_is_waited_for_and_costs_no_restart(harness) -> None:
    """Node c's agent is lost and c does not answer: state waiting with since-when and why,
    node_up 0, nothing launched; once c answers, relaunched at once, budget untouched."""
    h = harness()
    await h.ready_gang(1)
    h.answers.away_nodes = {"c": ASLEEP}
    h.monitor.on_agent_lost("c", AgentExit("the agent did not answer a ping within 15 s", None, []))
    await h.until(lambda: waiting_for_c(h), "waiting for c")
    reason = h.supervisor.view.reason
    assert re.fullmatch(rf"waiting for node c: unreachable since \d\d:\d\d:\d\d \({ASLEEP}\)",
                        reason), reason
    assert state_metric(h, "waiting") == 1 and state_metric(h, "ready") == 0
    assert sample(h.metrics, "orchestrator_node_up", node="c") == 0
    asked, launches = h.answers.asked, len(h.gangs)
    await h.until(lambda: h.answers.asked > asked + 3, "asking c again")
    assert len(h.gangs) == launches and h.supervisor.view.reason == reason  # still since then
    failed_at = h.clock()
    h.answers.away_nodes = {}
    await h.ready_gang(2)
    assert h.launched_at[-1] - failed_at <= 2.0  # the next retry, no backoff
    assert h.supervisor.view.restarts == 0 and h.supervisor.policy.restarts_in_window == 0
    assert h.restarts(Cause.AGENT_LOST) == 0
    assert h.supervisor.view.snapshot().history[-1].root.cause == Cause.AGENT_LOST  # still shown
    assert (await stop(h)).restarts == 0


async def test_a_node_that_sleeps_again_and_again_never_exhausts_the_budget(harness) -> None:
    """Three absences with max_restarts = 1: each is waited out, the cluster never fails."""
    h = harness(max_restarts=1)
    for number in (1, 2, 3):
        await h.ready_gang(number)
        h.answers.away_nodes = {"b": ASLEEP}
        h.crash(1, signal="SIGKILL")
        await h.until(lambda: h.supervisor.view.state == GangState.WAITING, "waiting")
        h.answers.away_nodes = {}
    await h.ready_gang(4)
    assert h.supervisor.view.restarts == 0
    assert not any(r.startswith("failed") for r in h.reasons)


async def test_a_node_away_past_node_wait_s_fails_the_cluster_with_the_reason(harness) -> None:
    """Away longer than node_wait_s: failed, naming the node, since when, the error and the
    fix; no restart spent. `orchestrator restart` once it is back: serving again."""
    h = harness(node_wait_s=30.0)
    await h.ready_gang(1)
    failed_at: list[float] = []
    h.supervisor.machine.on_change(
        lambda old, new, reason: failed_at.append(h.clock()) if new == GangState.FAILED else None)
    h.answers.away_nodes = {"c": ASLEEP, "b": "unreachable: no route to 10.0.0.2:22"}
    crashed_at = h.clock()
    h.crash(2, signal="SIGKILL")
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    # The deadline on the fake clock: failed once 30 s had passed, within one retry (2 s).
    assert len(failed_at) == 1 and 30.0 <= failed_at[0] - crashed_at <= 30.0 + NODE_RETRY_S
    reason = h.supervisor.view.reason
    assert re.match(r"node c, b unreachable since \d\d:\d\d:\d\d, longer than node_wait_s "
                    r"\(30 s\): c: timeout: .*; b: unreachable: no route", reason), reason
    assert "orchestrator restart" in reason and h.supervisor.view.restarts == 0
    assert any(r.startswith("waiting: waiting for nodes c: unreachable since") for r in h.reasons)
    assert len(h.gangs) == 1
    h.answers.away_nodes = {}
    h.supervisor.request_restart()
    await h.ready_gang(2)


async def test_a_node_that_never_confirms_the_stop_does_not_hold_up_the_wait(
    harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop of c's rank is never answered and c does not answer a ping: the stop ends
    once the other ranks confirmed, not after the grace plus STOP_ANSWER_S (60 s here), c
    is waited for without a second ping, and its rank stays recorded as running (to reap)."""
    monkeypatch.setattr(gang_stop, "STOP_ANSWER_S", 60.0)
    h = harness()
    first = await h.ready_gang(1)
    first.silent_node = "c"
    h.answers.away_nodes = {"c": ASLEEP}
    asked_before, asked_when_waiting = h.answers.asked, list[int]()
    h.supervisor.machine.on_change(lambda old, new, reason: asked_when_waiting.append(
        h.answers.asked) if new == GangState.WAITING else None)
    h.crash(0, signal="SIGKILL")
    await h.until(lambda: waiting_for_c(h), "waiting for c")  # within 5 s
    assert first.ranks[2].running and [r.rank for r in first.unconfirmed()] == [2]
    assert not first.ranks[1].running  # b's stop was confirmed before the stop ended
    # One ping, sent with the stop, told c away: not asked again before waiting for it.
    assert asked_when_waiting[0] == asked_before + 1, (asked_before, asked_when_waiting)
    h.answers.away_nodes = {}
    await h.ready_gang(2)
    assert h.supervisor.view.restarts == 0


async def test_a_stop_never_confirmed_by_a_node_that_answers_ends_after_the_grace(
    harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c answers pings but never confirms its rank's stop: the stop gives up after the
    grace plus STOP_ANSWER_S, and the next gang launches with c's rank left to reap."""
    monkeypatch.setattr(gang_stop, "STOP_ANSWER_S", 0.05)
    h = harness(stop_grace_s=0.05)
    first = await h.ready_gang(1)
    first.silent_node = "c"
    h.crash(0, signal="SIGKILL")
    await h.ready_gang(2)
    assert first.ranks[2].running and [r.rank for r in first.unconfirmed()] == [2]


async def test_a_link_check_failing_because_its_node_is_away_waits_for_the_node(harness) -> None:
    """At the relaunch a link fails and its far node does not answer: the node is waited
    for (reconnected when back), not the link for ever."""
    h = harness()
    await h.ready_gang(1)
    h.links.down = True
    h.crash(1, returncode=1)
    await h.until(lambda: "waiting for links" in h.supervisor.view.reason, "waiting for links")
    h.answers.away_nodes = {"b": ASLEEP}
    await h.until(lambda: "waiting for node b" in h.supervisor.view.reason, "waiting for b")
    assert h.supervisor.view.restarts == 1  # the crash's; the absence spends none
    h.answers.away_nodes, h.links.down = {}, False
    await h.ready_gang(2)
    assert h.supervisor.view.restarts == 1


# ── which errors mean "away": real connection attempts, no sshd needed ──


def pool_of(tmp_path: Path, **node: object) -> NodePool:
    data = {"cluster": {"state_dir": str(tmp_path)}, "nodes": [{"name": "n2", **node}]}
    spec, _ = check_cluster_data(data, tmp_path / "cluster.toml")
    return NodePool(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None,
                    connect_timeout_s=5.0)


async def test_nothing_listening_on_the_ssh_port_counts_as_away(tmp_path: Path) -> None:
    """A refused connection (a Mac booting, sshd not up yet): away, with the error."""
    pool = pool_of(tmp_path, transport="ssh", ssh="me@127.0.0.1", ssh_port=free_port(),
                   python="python3")
    away = await NodeAnswers(pool).away(["n2"])
    assert list(away) == ["n2"] and away["n2"].startswith("refused: 127.0.0.1:")


async def test_a_fault_waiting_cannot_fix_is_not_away(tmp_path: Path) -> None:
    """An identity file that does not exist is a config error: not waited for."""
    pool = pool_of(tmp_path, transport="ssh", ssh="me@127.0.0.1", python="python3",
                   identity_file=str(tmp_path / "missing_key"))
    with pytest.raises(TransportError) as caught:
        await pool.connect("n2")
    assert caught.value.kind == ErrorKind.CONFIG
    assert await NodeAnswers(pool).away(["n2"]) == {}


async def test_a_connected_agent_that_answers_is_not_away(tmp_path: Path) -> None:
    """A real local agent answers its ping."""
    pool = pool_of(tmp_path)
    await pool.connect("n2")
    try:
        assert await NodeAnswers(pool).away(["n2"]) == {}
    finally:
        await pool.close_all()

