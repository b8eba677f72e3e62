"""What an agent keeps about its gang so that a new orchestrator can adopt it.

    orchestrator ─Spawn(launch=LaunchRecord)─▶ agent     kept with the running gang
    new orchestrator ─ListRanks─▶ agent ─RankList(ranks, launch, orphaned_since)─▶ adopt?
    new orchestrator ─Adopt(launch_id)─▶ agent           the orphan grace ends: supervised

The record is the one place an adopting orchestrator learns per-launch data from the
agents: a field added here (a per-launch secret, say) reaches it with no other change.
"""

from __future__ import annotations

from msgspec import Struct

from contract.message import Message
from contract.placement import Placement

# ErrorReply code of a connection the agent turns away: another orchestrator controls it.
AGENT_BUSY = "agent_busy"


class LaunchRecord(Struct, kw_only=True):
    """One launch as the orchestrator that started it describes it."""

    launch_id: str
    config_digest: str  # of the cluster.toml settings (orchestrator/launch/adoption.py)
    code_digest: str  # of the code the ranks run: the contract and serving packages
    model_digest: str  # of every node's model digest, in node order
    placement: Placement | None = None  # the split the gang runs, reused on adoption
    # The nodes the gang runs on, in rank order: fewer than cluster.toml's when it was
    # re-planned on the nodes that remained (a Mac asleep); [] (an older record): every node.
    nodes: list[str] = []


class Adopt(Message, tag="adopt", kw_only=True):
    """The sender now supervises the gang of launch_id: the agent's orphan grace ends."""

    id: int = 0
    launch_id: str
