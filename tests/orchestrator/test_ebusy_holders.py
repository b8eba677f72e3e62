"""EBUSY that waiting cannot clear: the holders of the RDMA devices are found, ours ended,
one retry without spending a restart, otherwise failed naming them (fake clock)."""

from __future__ import annotations

from contract.agent_protocol import RdmaHolder
from contract.exit_codes import RankExit
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.state import GangState
from serving.faults import EBUSY_LINE
from tests.orchestrator.supervisor_harness import Harness

EBUSY_EXIT = {"returncode": RankExit.DISTRIBUTED_INIT_FAILED, "stderr_tail": [EBUSY_LINE]}


def ebusy(h: Harness) -> None:
    h.crash(0, **EBUSY_EXIT)


def old_rank(pid: int, launch_id: str) -> RdmaHolder:
    return RdmaHolder(pid=pid, command="python -m serving.rank", jaccl_env=True,
                      launch_id=launch_id)


async def test_ebusy_ends_our_own_holders_and_retries_once_without_a_restart(harness) -> None:
    """A rank of an earlier launch of ours still holds the device on b: ended by PID, the
    relaunch follows the cool-down, and no restart is spent."""
    h = harness()
    await h.ready_gang(1)
    h.holders.found = {"b": [old_rank(4242, "L1")]}
    ebusy(h)
    await h.ready_gang(2)
    assert h.holders.ended == [("b", 4242)]
    assert h.waited() == 30.0  # ebusy_cooldown_s: a killed holder's resources take a while
    assert h.supervisor.restarts == 0 and h.restarts(Cause.EBUSY) == 0


async def test_ebusy_held_by_a_program_not_ours_fails_at_once_naming_it(harness) -> None:
    """Another MLX program holds the device: never ended; failed at once with its pid, node,
    command and the runbook step; the budget untouched."""
    h = harness()
    await h.ready_gang(1)
    other = RdmaHolder(pid=777, command="python -m mlx_lm.server --model big", jaccl_env=True)
    h.holders.found = {"c": [other], "b": [old_rank(4242, "L1")]}
    ebusy(h)
    await h.until(lambda: h.supervisor.state == GangState.FAILED, "failed")
    reason = h.supervisor.reason
    assert reason.startswith("ebusy: rank 0 on a: ")
    assert "not this cluster's (not ended): pid 777 on c: python -m mlx_lm.server --model big " \
        "(JACCL env)" in reason
    assert "docs/operations.md" in reason
    assert "orchestrator restart" in reason
    assert h.holders.ended == [("b", 4242)]  # ours only
    assert h.supervisor.restarts == 0 and len(h.gangs) == 1


async def test_ebusy_again_after_the_retry_fails_with_the_reboot_step(harness) -> None:
    """Nothing holds the device and the one retry meets EBUSY again: failed, saying so and
    what to do (reboot; device names may change), no restart spent."""
    h = harness()
    await h.ready_gang(1)
    h.start_exits = [EBUSY_EXIT]  # the retry's launch
    ebusy(h)
    await h.until(lambda: h.supervisor.state == GangState.FAILED, "failed")
    assert len(h.gangs) == 2 and h.launched_at[1] - h.launched_at[0] >= 30.0
    assert "EBUSY again after one retry" in h.supervisor.reason
    assert "reboot the node" in h.supervisor.reason and "ibv_devices" in h.supervisor.reason
    assert h.supervisor.restarts == 0 and h.restarts(Cause.EBUSY) == 0


async def test_a_gang_that_served_gets_its_own_retry(harness) -> None:
    """The retry is spent only until a gang is ready: a later EBUSY retries again."""
    h = harness()
    for number in (1, 2, 3):
        await h.ready_gang(number)
        ebusy(h)
    await h.ready_gang(4)
    assert h.supervisor.restarts == 0
