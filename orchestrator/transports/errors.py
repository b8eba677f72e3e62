"""Errors a transport reports, classified so the user learns what to fix."""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    DNS = "dns"  # the host name does not resolve
    REFUSED = "refused"  # nothing listens on the SSH port
    UNREACHABLE = "unreachable"  # no route to the host
    TIMEOUT = "timeout"  # no answer within the connect timeout
    AUTH = "auth"  # the key (file or ssh-agent) was not accepted
    HOST_KEY = "host_key"  # unknown or changed host key
    DEPLOY = "deploy"  # copying the code to the node failed
    AGENT_START = "agent_start"  # the agent did not come up (python missing, msgspec missing...)
    PROTOCOL = "protocol"  # the agent speaks another protocol version or garbage
    AGENT_LOST = "agent_lost"  # the channel to a running agent closed
    AGENT_BUSY = "agent_busy"  # the node's agent is controlled by another orchestrator
    AGENT_SOCKET = "agent_socket"  # the agent socket is not ours (another user's, open)
    CONFIG = "config"  # a node setting the transport cannot use
    OTHER = "other"


class TransportError(Exception):
    """A failure to reach, prepare or talk to a node's agent."""

    def __init__(self, node: str, kind: ErrorKind, message: str) -> None:
        super().__init__(f"node {node!r}: {message}")
        self.node = node
        self.kind = kind
        self.message = message


class AgentRequestError(Exception):
    """The agent answered a request with an error (protocol.ErrorReply)."""

    def __init__(self, node: str, code: str, message: str) -> None:
        super().__init__(f"node {node!r}: agent refused ({code}): {message}")
        self.node = node
        self.code = code
        self.message = message
