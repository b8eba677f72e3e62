"""init's HOST arguments: "local", "[user@]host", "[user@]host:port", "[user@][v6]:port".

The port ends up as the node's `ssh_port`; the rest, as given, as its `ssh`. A bare IPv6
address ("me@fe80::1") has colons of its own: it takes a port only in brackets.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.init.probe import DEFAULT_SSH_PORT


class TargetError(ValueError):
    """A HOST argument that cannot be reached as written; the message says why."""


@dataclass(frozen=True)
class Target:
    ssh: str  # "me@studio-a.local", "me@[::1]", "local"
    port: int = DEFAULT_SSH_PORT

    @property
    def local(self) -> bool:
        return self.ssh == "local"


def parse_target(text: str) -> Target:
    if text == "local":
        return Target(text)
    user, at, host = text.rpartition("@")
    if not host:
        raise TargetError(f"{text!r}: no host after the user")
    port: str | None = None
    if host.startswith("["):
        closing = host.find("]")
        if closing < 0:
            raise TargetError(f"{text!r}: '[' without ']'")
        host, rest = host[: closing + 1], host[closing + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise TargetError(f"{text!r}: only ':PORT' may follow ']'")
            port = rest[1:]
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    if not host or host == "[]":
        raise TargetError(f"{text!r}: no host")
    return Target(f"{user}{at}{host}", DEFAULT_SSH_PORT if port is None else _port(text, port))


def _port(text: str, port: str) -> int:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise TargetError(f"{text!r}: the port {port!r} is not a number from 1 to 65535")
    return int(port)
