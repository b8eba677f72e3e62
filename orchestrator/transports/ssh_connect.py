"""Opening an SSH connection to a node: host key policy and errors a user can act on.

Host keys are always verified against the node's known_hosts file (default
~/.ssh/known_hosts). An unknown key is refused with the command that adds it,
unless the node sets accept_new_host_keys = true (then it is appended to the
file, like OpenSSH's StrictHostKeyChecking=accept-new). A changed key is
refused, always.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shlex
import socket
import sys
from pathlib import Path

import asyncssh

from orchestrator.config import NodeSpec
from orchestrator.transports.errors import ErrorKind, TransportError

log = logging.getLogger("orchestrator.transports")


def ssh_target(node: NodeSpec) -> tuple[str | None, str]:
    """("user" or None, "host") from node.ssh ("user@host", "host", "user@[::1]")."""
    if not node.ssh:
        raise TransportError(
            node.name, ErrorKind.CONFIG, "transport = 'ssh' needs ssh = 'user@host'"
        )
    user, sep, _ = node.ssh.rpartition("@")
    host = node.ssh_host
    if not host:
        raise TransportError(node.name, ErrorKind.CONFIG, f"ssh = {node.ssh!r} names no host")
    return (user if sep and user else None), host


def known_hosts_path(node: NodeSpec) -> Path:
    return Path(node.known_hosts or "~/.ssh/known_hosts").expanduser()


def host_pattern(host: str, port: int) -> str:
    """How known_hosts names the host: plain on port 22, else [host]:port."""
    return host if port == 22 else f"[{host}]:{port}"


def _load_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    try:
        return asyncssh.read_known_hosts(str(path))
    except FileNotFoundError:
        return asyncssh.import_known_hosts("")


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


async def _is_known(known: asyncssh.SSHKnownHosts, host: str, port: int) -> bool:
    """Whether known_hosts has any key (or CA) for host, under its name or an address."""
    for addr in [""] + await _resolve(host, port):
        host_keys, ca_keys, *_ = known.match(host, addr, port)
        if host_keys or ca_keys:
            return True
    return False


def _keyscan_hint(host: str, port: int, path: Path) -> str:
    scan = shlex.join(["ssh-keyscan", "-p", str(port), host])
    return f"{scan} >> {shlex.quote(str(path))}"


async def _add_host_key(node: NodeSpec, host: str, port: int, path: Path, timeout: float) -> None:
    key = await asyncio.wait_for(asyncssh.get_server_host_key(host, port), timeout)
    if key is None:
        raise TransportError(node.name, ErrorKind.HOST_KEY, f"{host}:{port} offered no host key")
    alg, blob = key.export_public_key("openssh").decode().split()[:2]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with path.open("a") as f:
        f.write(f"{host_pattern(host, port)} {alg} {blob}\n")
    path.chmod(0o600)
    log.warning(
        "[%s] added the host key of %s:%d (%s) to %s (accept_new_host_keys)",
        node.name,
        host,
        port,
        alg,
        path,
    )


def _host_key_error(
    node: NodeSpec, host: str, port: int, path: Path, changed: bool
) -> TransportError:
    if changed:
        return TransportError(
            node.name,
            ErrorKind.HOST_KEY,
            (
                f"the host key of {host}:{port} has CHANGED: it does not match {path}. "
                "This can be a man-in-the-middle attack. If the host was reinstalled, check its "
                "new key out of band, then remove the old entry with "
                f"{shlex.join(['ssh-keygen', '-R', host_pattern(host, port), '-f', str(path)])}"
            ),
        )
    return TransportError(
        node.name,
        ErrorKind.HOST_KEY,
        (
            f"the host key of {host}:{port} is not in {path}; refusing an unknown host. "
            f"Verify it and add it: {_keyscan_hint(host, port, path)} "
            f"(or set accept_new_host_keys = true for node {node.name!r})"
        ),
    )


def local_network_hint(code: int | None, platform: str = sys.platform) -> str:
    """macOS 15+ answers a LAN connection that Local Network privacy blocks with
    EHOSTUNREACH, exactly like a host that is gone (Apple's TN3179)."""
    if platform != "darwin" or code != errno.EHOSTUNREACH:
        return ""
    return (
        ". If the host is up on your local network, this is usually macOS's Local Network "
        "privacy: a launchd LaunchAgent, or a terminal app not allowed yet (iTerm2, VS "
        "Code...; Apple's Terminal and SSH sessions are exempt), cannot reach LAN hosts. "
        "Allow the app in System Settings > Privacy & Security > Local Network, or run "
        "the job as a LaunchDaemon"
    )


def classify(node: NodeSpec, host: str, port: int, exc: BaseException) -> TransportError:
    """Map a connection failure to a TransportError whose message says what to fix."""
    where = f"{host}:{port}"
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, socket.gaierror):
        return TransportError(
            node.name, ErrorKind.DNS, f"cannot resolve host {host!r}: {exc.strerror}"
        )
    if isinstance(exc, ConnectionRefusedError):
        return TransportError(
            node.name,
            ErrorKind.REFUSED,
            f"{where} refused the connection: is sshd running on port {port}?",
        )
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return TransportError(node.name, ErrorKind.TIMEOUT, f"no answer from {where} in time")
    if isinstance(exc, asyncssh.PermissionDenied):
        how = (
            f"key file {node.identity_file}"
            if node.identity_file
            else "your ssh-agent and default keys"
        )
        return TransportError(
            node.name, ErrorKind.AUTH, f"{where} did not accept {how}: {exc.reason}"
        )
    if isinstance(exc, FileNotFoundError) and node.identity_file:
        return TransportError(
            node.name,
            ErrorKind.CONFIG,
            f"identity_file {node.identity_file} does not exist on this machine: give the "
            "path of the private key that logs in to the node",
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return TransportError(
            node.name, ErrorKind.AUTH, f"cannot use identity_file {node.identity_file}: {exc}"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return TransportError(
            node.name,
            ErrorKind.UNREACHABLE,
            f"no route to {where}: {exc.strerror}{local_network_hint(exc.errno)}",
        )
    if isinstance(exc, asyncssh.DisconnectError):
        return TransportError(node.name, ErrorKind.OTHER, f"{where} disconnected: {exc.reason}")
    return TransportError(node.name, ErrorKind.OTHER, f"cannot connect to {where}: {exc!r}")


# AES-GCM first: asyncssh runs it as one OpenSSL call per packet (AES instructions on
# Apple Silicon and x86), where its ChaCha20-Poly1305 takes two and ~1.7x the CPU; model
# pushes (orchestrator sync) are bound by it. The rest is asyncssh's default order.
ENCRYPTION_ALGS = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
]


async def open_connection(
    node: NodeSpec, *, connect_timeout: float, keepalive_interval: float, keepalive_count_max: int
) -> asyncssh.SSHClientConnection:
    user, host = ssh_target(node)
    port = node.ssh_port
    path = known_hosts_path(node)

    async def attempt() -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            host,
            port,
            username=user or (),
            known_hosts=_load_known_hosts(path),
            client_keys=[node.identity_file] if node.identity_file else (),
            connect_timeout=connect_timeout,
            keepalive_interval=keepalive_interval,
            keepalive_count_max=keepalive_count_max,
            encryption_algs=ENCRYPTION_ALGS,
        )

    try:
        try:
            return await attempt()
        except asyncssh.HostKeyNotVerifiable:
            changed = await _is_known(_load_known_hosts(path), host, port)
            if changed or not node.accept_new_host_keys:
                raise _host_key_error(node, host, port, path, changed) from None
        await _add_host_key(node, host, port, path, connect_timeout)
        return await attempt()
    except asyncssh.HostKeyNotVerifiable as exc:
        raise TransportError(
            node.name, ErrorKind.HOST_KEY, f"host key of {host}:{port} refused: {exc.reason}"
        ) from None
    except Exception as exc:
        raise classify(node, host, port, exc) from exc
