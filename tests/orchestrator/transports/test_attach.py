"""A local agent that outlived its orchestrator's session, reached again on its socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.adoption import LaunchRecord
from contract.agent_protocol import Spawn
from orchestrator.config import NodeSpec
from orchestrator.transports import ErrorKind, TransportError
from orchestrator.transports.local import LocalTransport
from testkit.agent_events import kill_if_alive, pid_gone, wait_gone

pytestmark = pytest.mark.timeout(60)
RECORD = LaunchRecord(launch_id="L1", config_digest="c", code_digest="k", model_digest="m")


async def test_session_lost_then_attached_and_adopted(tmp_path: Path) -> None:
    """The first session ends without a stop: the rank serves on; a second transport finds
    the agent on its socket, with the rank, its launch record and since when it was alone;
    a third is refused while the second is connected; after adopt, close ends it all."""
    socket = str(tmp_path / "state" / "agents" / "c.n.sock")
    first = LocalTransport(NodeSpec(name="n"), code_cache=tmp_path / "code")
    agent = await first.start_agent(socket=socket, orphan_grace_s=30.0)
    assert not agent.attached
    spawn = Spawn(rank=0, argv=["sleep", "1000"], env={"MLX_LAUNCH_ID": "L1"}, launch=RECORD)
    rank = (await agent.spawn(spawn)).pid
    try:
        agent._channel.close_stdin()  # as a SIGKILLed orchestrator's pipe would
        await agent.finished
        assert not pid_gone(rank)
        second = LocalTransport(NodeSpec(name="n"), code_cache=tmp_path / "code")
        again = await second.start_agent(socket=socket, orphan_grace_s=30.0)
        assert again.attached and again.hello is not None
        state = await again.launch_state()
        assert [(r.rank, r.pid) for r in state.ranks] == [(0, rank)]
        assert state.launch == RECORD and state.orphaned_since is not None
        third = LocalTransport(NodeSpec(name="n"), code_cache=tmp_path / "code")
        with pytest.raises(TransportError) as busy:
            await third.start_agent(socket=socket, orphan_grace_s=30.0)
        assert busy.value.kind == ErrorKind.AGENT_BUSY
        await again.adopt("L1")
        assert (await again.launch_state()).orphaned_since is None
        await again.stop(None, 2.0)
        await second.close()
        assert await wait_gone(rank, 5)
        await first.close()  # reaps the agent: it was our child
        assert await wait_gone(again.hello.pid, 10)
        assert not Path(socket).exists()
    finally:
        kill_if_alive(rank)
        await first.close()
