"""What the supervision loop asks of the world: rank 0, the links, the nodes' answers and
the RDMA devices' holders. Implemented over HTTP and the agents; faked in unit tests."""

from __future__ import annotations

from typing import Protocol

from contract.agent_protocol import RdmaHolder
from orchestrator.launch.reachability import LinkFailure
from orchestrator.supervision.progress import ServingSample


class Probe(Protocol):
    """Rank 0 as the loop sees it (progress.Rank0Probe over HTTP; a fake in unit tests)."""

    async def healthy(self, base_url: str, timeout_s: float, tls_cert: str = "") -> bool: ...

    async def sample(self, base_url: str, tls_cert: str = "") -> ServingSample | None: ...


class Links(Protocol):
    """The links between ranks (launch.reachability.LinkChecks; a fake in unit tests)."""

    async def check(self) -> list[LinkFailure]: ...

    async def watch(self) -> None: ...

    async def unwatch(self) -> None: ...


class Answers(Protocol):
    """Which nodes cannot be reached now (node_wait.NodeAnswers; a fake in unit tests)."""

    async def away(self, names: list[str]) -> dict[str, str]: ...


class Holders(Protocol):
    """What holds the RDMA devices, and ending ours (rdma_holders.AgentHolders; a fake in
    unit tests)."""

    async def find(self, nodes: list[str]) -> dict[str, list[RdmaHolder]]: ...

    async def end(self, node: str, holder: RdmaHolder) -> bool: ...
