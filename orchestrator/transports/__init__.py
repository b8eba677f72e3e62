"""Transports: how the orchestrator reaches each node's agent.

Public API:
    transport_for(node, **options) -> Transport   LocalTransport | SshTransport
    Transport: connect(), deploy() -> DeployResult, start_agent(...) -> AgentHandle, close()
               without an agent: run(argv) -> Completed, open_files() -> NodeFiles (files.py)
    AgentHandle: fingerprint(), spawn(), stop(), ping(), list_ranks(),
                 request(), finished, closed, close()
    TransportError(kind: ErrorKind), AgentRequestError
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.config import NodeSpec
from orchestrator.transports.base import Completed, DeployResult, Transport
from orchestrator.transports.errors import AgentRequestError, ErrorKind, TransportError
from orchestrator.transports.files import NodeFiles
from orchestrator.transports.handle import AgentExit, AgentHandle
from orchestrator.transports.local import LocalTransport

if TYPE_CHECKING:  # imported when first used: asyncssh costs 0.25 s of every CLI start
    from orchestrator.transports.ssh import SshTransport

__all__ = [
    "AgentExit",
    "AgentHandle",
    "AgentRequestError",
    "Completed",
    "DeployResult",
    "ErrorKind",
    "LocalTransport",
    "NodeFiles",
    "SshTransport",
    "Transport",
    "TransportError",
    "transport_for",
]


def transport_for(node: NodeSpec, **options: Any) -> Transport:
    """The transport a node's config asks for; options go to its constructor."""
    if node.transport == "ssh":
        from orchestrator.transports.ssh import SshTransport

        return SshTransport(node, **options)
    return LocalTransport(node, **options)


def __getattr__(name: str) -> Any:
    """`SshTransport` on first use (PEP 562), so a local cluster never imports asyncssh."""
    if name == "SshTransport":
        from orchestrator.transports.ssh import SshTransport

        return SshTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
