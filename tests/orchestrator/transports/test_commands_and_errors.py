"""Remote command quoting, error classification, and agents that speak the wrong protocol."""

from __future__ import annotations

import asyncio
import errno
import shlex
import socket
import sys
from pathlib import Path

import pytest

from orchestrator.config import NodeSpec
from orchestrator.transports import ErrorKind, LocalTransport, SshTransport, TransportError
from orchestrator.transports.deploy import CodeBundle
from orchestrator.transports.remote_command import agent_command
from orchestrator.transports.ssh_connect import classify, local_network_hint, ssh_target

HOSTILE = [
    "python3; touch /tmp/x",
    "$(reboot)",
    "`id`",
    "a b",
    "it's",
    '"q"',
    "-rf",
    "~user",
    "x\ny",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_agent_command_keeps_each_value_one_word(value: str) -> None:
    """Whatever python and dir hold, the shell sees them as single literal words."""
    command = agent_command(f"/cache/{value}", value, 5.0)
    words = shlex.split(command)
    assert words == [
        "cd",
        f"/cache/{value}",
        "&&",
        "exec",
        value,
        "-m",
        "node_agent",
        "--grace",
        "5",
    ]


def test_agent_command_expands_only_a_leading_home() -> None:
    """`~/venv/bin/python` becomes "$HOME"/'venv/bin/python'; nothing else is expanded."""
    assert agent_command("/c", "~/venv/bin/python", 5).endswith(
        'exec "$HOME"/venv/bin/python -m node_agent --grace 5'
    )
    assert "'~user/python'" in agent_command("/c", "~user/python", 5)


def test_ssh_target_forms() -> None:
    """user@host, host and user@[ipv6] are understood; a missing host is a config error."""
    assert ssh_target(NodeSpec(name="a", transport="ssh", ssh="me@mac-b")) == ("me", "mac-b")
    assert ssh_target(NodeSpec(name="a", transport="ssh", ssh="mac-b")) == (None, "mac-b")
    assert ssh_target(NodeSpec(name="a", transport="ssh", ssh="me@[::1]")) == ("me", "::1")
    with pytest.raises(TransportError) as err:
        ssh_target(NodeSpec(name="a", transport="ssh"))
    assert err.value.kind == ErrorKind.CONFIG


def test_error_classification() -> None:
    """Resolver, refusal and timeout failures map to kinds with actionable messages."""
    node = NodeSpec(name="b", transport="ssh", ssh="me@mac-b")
    dns = classify(
        node, "mac-b", 22, socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    )
    assert dns.kind == ErrorKind.DNS and "mac-b" in dns.message
    refused = classify(node, "mac-b", 22, ConnectionRefusedError(111, "refused"))
    assert refused.kind == ErrorKind.REFUSED and "sshd" in refused.message
    assert classify(node, "mac-b", 22, TimeoutError()).kind == ErrorKind.TIMEOUT


def test_no_route_to_host_on_macos_names_local_network_privacy() -> None:
    """EHOSTUNREACH is what macOS 15+ gives a process Local Network privacy blocks: on a Mac
    the fix names that setting; elsewhere, and for ENETUNREACH, it stays a network fault."""
    node = NodeSpec(name="b", transport="ssh", ssh="me@192.168.1.60")
    unreachable = OSError(errno.EHOSTUNREACH, "No route to host")
    error = classify(node, "192.168.1.60", 22, unreachable)
    assert error.kind == ErrorKind.UNREACHABLE
    assert error.message.startswith("no route to 192.168.1.60:22: No route to host")
    hint = local_network_hint(errno.EHOSTUNREACH, "darwin")
    assert "Local Network privacy" in hint and "Privacy & Security > Local Network" in hint
    assert "LaunchAgent" in hint and "LaunchDaemon" in hint
    assert local_network_hint(errno.EHOSTUNREACH, "linux") == ""
    assert local_network_hint(errno.ENETUNREACH, "darwin") == ""


def fake_agent_bundle(tmp_path: Path, first_line: str) -> CodeBundle:
    """A node_agent whose first line is first_line: an old or foreign agent."""
    pkg = tmp_path / "src" / "node_agent"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    main = f"import sys\nsys.stdout.write({first_line!r} + '\\n')\nsys.stdout.flush()\n"
    (pkg / "__main__.py").write_text(main + "sys.stdin.read()\n")
    return CodeBundle.from_local(tmp_path / "src")


@pytest.mark.parametrize(
    ("first_line", "expected"),
    [
        (
            '{"type":"hello","agent_version":"9","protocol_version":99,"pid":1,"hostname":"h","python":"p"}',
            "protocol 99",
        ),
        ("Welcome to the machine", "expected the agent's hello"),
    ],
)
async def test_wrong_protocol_agent_is_refused(
    tmp_path: Path, first_line: str, expected: str
) -> None:
    """An agent of another protocol version, or not an agent at all, is refused clearly."""
    node = NodeSpec(name="old", python=sys.executable)
    transport = LocalTransport(
        node, code_cache=tmp_path / "code", bundle=fake_agent_bundle(tmp_path, first_line)
    )
    with pytest.raises(TransportError) as err:
        await transport.start_agent(start_timeout=10)
    assert err.value.kind == ErrorKind.PROTOCOL and expected in err.value.message
    await transport.close()


async def test_silent_server_times_out(tmp_path: Path) -> None:
    """A port that accepts but never speaks SSH is a timeout, after connect_timeout."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # say nothing until the client gives up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    node = NodeSpec(
        name="mute",
        transport="ssh",
        ssh="me@127.0.0.1",
        ssh_port=port,
        known_hosts=str(tmp_path / "known_hosts"),
    )
    try:
        with pytest.raises(TransportError) as err:
            async with SshTransport(node, connect_timeout=1.0):
                pass
        assert err.value.kind == ErrorKind.TIMEOUT and f"127.0.0.1:{port}" in err.value.message
    finally:
        server.close()
        await server.wait_closed()


async def test_local_deploy_replaces_an_unmarked_copy(tmp_path: Path) -> None:
    """A code dir without its CODE_DIGEST marker (a broken copy) is replaced, not used."""
    bundle = CodeBundle.from_local()
    broken = tmp_path / "code" / bundle.digest
    (broken / "node_agent").mkdir(parents=True)
    (broken / "node_agent" / "__main__.py").write_text("raise SystemExit('broken copy')\n")
    transport = LocalTransport(
        NodeSpec(name="l", python=sys.executable), code_cache=tmp_path / "code"
    )
    deployed = await transport.deploy()
    assert deployed.copied_files == len(bundle.files)
    assert (broken / "node_agent" / "__main__.py").read_text() == (
        bundle.root / "node_agent" / "__main__.py"
    ).read_text()
    agent = await transport.start_agent()
    assert agent.hello is not None and agent.hello.code_digest == bundle.digest
    await transport.close()
