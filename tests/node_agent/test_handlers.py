"""The agent's one table from request type to handler."""

from __future__ import annotations

import typing
from pathlib import Path

from contract.agent_protocol import Message, Open, Request
from node_agent.handlers import Handlers
from node_agent.links import LinkProbes
from node_agent.orphan import OrphanGrace
from node_agent.ranks import RankTable
from node_agent.usage import UsageReporter


async def _emit(msg: Message) -> None:
    del msg


async def test_every_request_but_open_has_a_handler(tmp_path: Path) -> None:
    """Each request type of the protocol is in the table; Open, the handshake, is not."""
    ranks = RankTable(_emit, tmp_path)
    handlers = Handlers(ranks, LinkProbes(_emit), UsageReporter(_emit, ranks.pids),
                        OrphanGrace(lambda reason: None))
    assert set(handlers.table()) == set(typing.get_args(Request)) - {Open}
