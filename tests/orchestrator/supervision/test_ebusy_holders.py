"""EBUSY that waiting cannot clear: the holders of the RDMA devices are found, ours ended,
one retry without spending a restart, otherwise failed naming them (fake clock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contract.agent_protocol import RdmaHolder
from contract.exit_codes import RankExit
from contract.rank_env import IBV_DEVICES, LAUNCH_ID
from orchestrator.config.load import check_cluster_data
from orchestrator.supervision.failures import Cause
from orchestrator.supervision.rdma_holders import AgentHolders, split_ours
from orchestrator.supervision.state import GangState
from orchestrator.transports.pool import NodePool
from serving.faults import EBUSY_LINE
from testkit.supervisor_harness import Harness

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
    assert h.supervisor.view.restarts == 0 and h.restarts(Cause.EBUSY) == 0


async def test_ebusy_held_by_a_program_not_ours_fails_at_once_naming_it(harness) -> None:
    """Another MLX program holds the device: never ended; failed at once with its pid, node,
    command and the runbook step; the budget untouched."""
    h = harness()
    await h.ready_gang(1)
    other = RdmaHolder(pid=777, command="python -m mlx_lm.server --model big", jaccl_env=True)
    h.holders.found = {"c": [other], "b": [old_rank(4242, "L1")]}
    ebusy(h)
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    reason = h.supervisor.view.reason
    assert reason.startswith("ebusy: rank 0 on a: ")
    assert "not this cluster's (not ended): pid 777 on c: python -m mlx_lm.server --model big " \
        "(JACCL env)" in reason
    assert "docs/operations.md" in reason
    assert "orchestrator restart" in reason
    assert h.holders.ended == [("b", 4242)]  # ours only
    assert h.supervisor.view.restarts == 0 and len(h.gangs) == 1


async def test_ebusy_again_after_the_retry_fails_with_the_reboot_step(harness) -> None:
    """Nothing holds the device and the one retry meets EBUSY again: failed, saying so and
    what to do (reboot; device names may change), no restart spent."""
    h = harness()
    await h.ready_gang(1)
    h.start_exits = [EBUSY_EXIT]  # the retry's launch
    ebusy(h)
    await h.until(lambda: h.supervisor.view.state == GangState.FAILED, "failed")
    assert len(h.gangs) == 2 and h.launched_at[1] - h.launched_at[0] >= 30.0
    assert "EBUSY again after one retry" in h.supervisor.view.reason
    reason = h.supervisor.view.reason
    assert "reboot the node" in reason and "ibv_devices" in reason
    assert h.supervisor.view.restarts == 0 and h.restarts(Cause.EBUSY) == 0


async def test_a_gang_that_served_gets_its_own_retry(harness) -> None:
    """The retry is spent only until a gang is ready: a later EBUSY retries again."""
    h = harness()
    for number in (1, 2, 3):
        await h.ready_gang(number)
        ebusy(h)
    await h.ready_gang(4)
    assert h.supervisor.view.restarts == 0


async def test_a_real_agent_finds_a_jaccl_process_and_ends_it_only_if_ours(
    tmp_path: Path,
) -> None:
    """Through a real local agent: a process with JACCL's env and launch L9 is listed; ended
    when L9 is ours, left running when it is not."""
    data = {"cluster": {"state_dir": str(tmp_path)}, "nodes": [{"name": "n0"}]}
    spec, _ = check_cluster_data(data, tmp_path / "cluster.toml")
    pool = NodePool(spec, on_event=lambda n, e: None, on_lost=lambda n, x: None)
    env = {**os.environ, IBV_DEVICES: "devices.json", LAUNCH_ID: "L9"}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                               start_new_session=True)
    await pool.connect("n0")
    try:
        holders = AgentHolders(pool)
        found = await holders.find(["n0"])
        mine = [h for h in found.get("n0", []) if h.pid == process.pid]
        assert len(mine) == 1 and mine[0].jaccl_env and mine[0].launch_id == "L9"
        ours, others = split_ours(found, {"L1"})
        assert (("n0", mine[0]) in others) and not any(h.pid == process.pid for _, h in ours)
        assert process.poll() is None  # nothing ended by finding
        ours, _ = split_ours(found, {"L9"})
        assert [await holders.end(node, h) for node, h in ours if h.pid == process.pid] == [True]
        assert process.wait(10) is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        await pool.close_all()
