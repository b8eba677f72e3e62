"""The supervision loop over fakes: scripted gangs, rank 0 and links, on a fake clock."""

from __future__ import annotations

from contract.exit_codes import RankExit
from orchestrator.supervision.failures import Cause, RunResult
from orchestrator.supervision.state import GangState
from orchestrator.transports import AgentExit
from testkit.supervisor_harness import stop


async def test_a_crash_stops_the_gang_and_relaunches_after_a_doubling_backoff(harness) -> None:
    """A rank exits: every rank of that gang is stopped, the next launch comes after the
    backoff (counted from the failure), and a second crash waits twice as long."""
    h = harness()
    first = await h.ready_gang(1)
    h.crash(1, returncode=1, stderr_tail=["ValueError: boom"])
    second = await h.ready_gang(2)
    assert all(rank.exited is not None for rank in first.ranks.values())
    assert second.launch_id != first.launch_id and all(r.running for r in second.ranks.values())
    assert h.restarts(Cause.RANK_CRASHED) == 1 and h.backoff() == 2.0 and h.waited() == 2.0
    history = h.supervisor.view.snapshot().history
    assert [f.rank for f in history[-1].failures] == [1]  # not the stops
    h.crash(2, signal="SIGKILL")
    await h.ready_gang(3)
    assert h.backoff() == 4.0 and h.waited() == 4.0 and h.restarts(Cause.RANK_CRASHED) == 2
    snapshot = h.supervisor.view.snapshot()
    assert snapshot.restarts == 2 and snapshot.launch_id == "L3"
    assert snapshot.last_failure is not None and snapshot.last_failure.rank == 2
    result = await stop(h)
    assert result.restarts == 2 and result.last is not None
    assert all(rank.exited is not None for rank in h.gang.ranks.values())


async def test_a_crash_loop_fails_the_cluster_until_restart(harness) -> None:
    """More than max_restarts failures in the window: failed, with the reason; restart
    (SIGHUP) gives a fresh budget and a new launch."""
    h = harness(max_restarts=2)
    for number in (1, 2, 3):
        await h.ready_gang(number)
        h.crash(1, returncode=1)
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    assert "more than 2 restarts" in h.supervisor.view.reason
    h.supervisor.request_restart()
    await h.ready_gang(4)
    h.crash(1, returncode=1)  # the budget is fresh: this one relaunches
    await h.ready_gang(5)
    assert h.restarts(Cause.RANK_CRASHED) == 3


async def test_no_progress_is_a_hang(harness) -> None:
    """Rank 0's step counter frozen past hang_timeout_s (fake time): cause hang, restart."""
    h = harness()
    await h.ready_gang(1)
    h.probe.frozen_url = h.gang.rank0_url
    await h.ready_gang(2)
    failure = h.supervisor.view.snapshot().last_failure
    assert failure is not None and failure.cause == Cause.HANG
    assert "no engine step for" in failure.detail


async def test_a_lost_agent_is_agent_lost(harness) -> None:
    """The agent of a node that runs a rank is lost: cause agent_lost on that node."""
    h = harness()
    await h.ready_gang(1)
    h.monitor.on_agent_lost("c", AgentExit("the agent's channel closed", None, []))
    await h.ready_gang(2)
    failure = h.supervisor.view.snapshot().last_failure
    assert failure is not None and (failure.cause, failure.node) == (Cause.AGENT_LOST, "c")


async def test_the_root_cause_is_the_crash_not_its_peer_lost_echo(harness) -> None:
    """A peer_lost exit reported before the real crash is an echo: the crash is the root."""
    h = harness()
    await h.ready_gang(1)
    h.crash(2, returncode=RankExit.PEER_LOST)
    h.crash(1, signal="SIGKILL")
    await h.ready_gang(2)
    last = h.supervisor.view.snapshot().history[-1]
    assert [f.cause for f in last.failures] == [Cause.PEER_LOST, Cause.RANK_CRASHED]
    assert (last.root.cause, last.root.rank) == (Cause.RANK_CRASHED, 1)
    assert h.restarts(Cause.PEER_LOST) == 0


async def test_a_peer_lost_echo_while_the_gang_stops_is_kept_as_a_consequence(harness) -> None:
    """A worker's peer_lost exit reported while the failed gang stops joins that gang's
    result; the crash stays the root and only the crash counts as a restart cause."""
    h = harness()
    await h.ready_gang(1)
    h.gang.echo_on_stop = {2}
    h.crash(1, signal="SIGKILL")
    await h.ready_gang(2)
    last = h.supervisor.view.snapshot().history[-1]
    assert [(f.cause, f.rank) for f in last.failures] == [
        (Cause.RANK_CRASHED, 1),
        (Cause.PEER_LOST, 2),
    ]
    assert last.root.rank == 1 and h.restarts(Cause.PEER_LOST) == 0


async def test_a_rank_the_node_refuses_to_start_fails_the_cluster_at_once(harness) -> None:
    """The agent refuses a spawn (missing interpreter): failed at once, naming the rank, its
    node and the reason, without spending the restart budget; restart tries again."""
    h = harness()
    h.fail_spawn = [1]
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    reason = h.supervisor.view.reason
    assert reason.startswith("spawn_failed: rank 1 on b: cannot start the rank: cannot start")
    assert "No such file or directory" in reason and "orchestrator restart" in reason
    assert h.supervisor.view.restarts == 0 and len(h.gangs) == 1
    h.supervisor.request_restart()
    await h.ready_gang(2)


async def test_relaunch_waits_for_dead_links(harness) -> None:
    """Links down at the relaunch: it waits, saying so, and launches once they answer."""
    h = harness()
    await h.ready_gang(1)
    h.links.down = True
    h.crash(1, returncode=1)
    await h.until(lambda: "waiting for links" in h.supervisor.view.reason, "waiting for links")
    assert h.supervisor.view.state == GangState.WAITING
    assert h.supervisor.view.reason == "waiting for links: a -> b 10.0.1.2:52101: no answer"
    checks, launches = h.links.checks, len(h.gangs)
    await h.until(lambda: h.links.checks > checks + 2, "checking again")
    assert len(h.gangs) == launches  # nothing launched over the dead link
    h.links.down = False
    await h.ready_gang(2)


async def test_stop_returns_the_result_with_every_rank_stopped(harness) -> None:
    """A stop request ends run() with a RunResult; no rank is left running."""
    h = harness()
    gang = await h.ready_gang(1)
    result = await stop(h)
    assert result == RunResult(restarts=0, last=None)
    assert all(rank.exited is not None and rank.exited.stopped for rank in gang.ranks.values())
    assert h.supervisor.view.state == GangState.STOPPED
