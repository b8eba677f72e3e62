"""The ssh transport against a real OpenSSH sshd on 127.0.0.1 (tests/sshd_fixture.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contract.agent_protocol import Spawn
from node_agent.code_digest import DIGEST_FILE
from orchestrator.transports import AgentHandle, ErrorKind, SshTransport, TransportError
from orchestrator.transports.deploy import CodeBundle
from testkit.agent_events import (
    CHATTY_RANK,
    EventLog,
    kill_if_alive,
    pid_gone,
    wait_gone,
)
from testkit.sshd import SshdServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def transport(sshd: SshdServer, tmp_path: Path, **node: Any) -> SshTransport:
    # A short keepalive so a dead link is noticed within a few seconds.
    return SshTransport(
        sshd.node(**node),
        code_cache=str(tmp_path / "remote-cache"),
        keepalive_interval=1.0,
        keepalive_count_max=2,
    )


@pytest.fixture
async def ssh_agent(
    sshd: SshdServer, tmp_path: Path
) -> AsyncIterator[tuple[AgentHandle, EventLog, SshTransport]]:
    events = EventLog()
    t = transport(sshd, tmp_path)
    await t.connect()
    handle = await t.start_agent(on_event=events)
    try:
        yield handle, events, t
    finally:
        await t.close()
        assert handle.hello is not None
        assert await wait_gone(handle.hello.pid)


async def test_deploy_twice_copies_once(sshd: SshdServer, tmp_path: Path) -> None:
    """SFTP deploy copies the packages once; the same digest is reused after."""
    async with transport(sshd, tmp_path) as t:
        first = await t.deploy()
        second = await t.deploy()
    assert first.copied_files > 0 and second.copied_files == 0
    code = Path(first.code_dir)
    assert code == tmp_path / "remote-cache" / first.digest
    assert (code / DIGEST_FILE).read_text().strip() == first.digest
    assert (code / "node_agent" / "agent.py").is_file() and (code / "serving").is_dir()
    assert not [p for p in code.parent.iterdir() if ".part-" in p.name]  # no temporary left


async def test_fingerprint_over_ssh(
    sshd: SshdServer, ssh_agent: tuple[AgentHandle, EventLog, SshTransport]
) -> None:
    """The agent runs under sshd from the deployed copy and reports the node."""
    handle, _, t = ssh_agent
    assert handle.hello is not None
    assert sshd.session_pids(handle.hello.pid)  # it really runs under our sshd
    fp = await handle.fingerprint()
    assert t._deployed is not None and fp.code_digest == t._deployed.digest
    assert fp.hostname == socket.gethostname() and "127.0.0.1" in fp.addresses()
    assert fp.packages["mlx"] is not None


async def test_spawn_logs_stop_exit_over_ssh(
    tmp_path: Path, ssh_agent: tuple[AgentHandle, EventLog, SshTransport]
) -> None:
    """Spawn, receive log lines, stop, receive the exit, over the SSH channel."""
    handle, events, _ = ssh_agent
    log_file = str(tmp_path / "r0.log")
    spawned = await handle.spawn(
        Spawn(rank=0, argv=CHATTY_RANK, log_file=log_file, env={"MLX_LAUNCH_ID": "L7"})
    )
    try:
        await events.wait_for(lambda: "warn on stderr" in events.lines(0, "stderr"))
        assert "launch L7" in events.lines(0, "stdout")
        (exited,) = await handle.stop(0, grace_s=5.0)
        assert (exited.pid, exited.signal, exited.stopped, exited.launch_id) == (
            spawned.pid,
            "SIGTERM",
            True,
            "L7",
        )
        assert (await events.wait_exit(0)).pid == spawned.pid
        assert pid_gone(spawned.pid)
        await handle.spawn(Spawn(rank=1, argv=["sh", "-c", "echo bye; exit 5"]))
        assert (await events.wait_exit(1)).returncode == 5
        assert "bye" in events.lines(1)
    finally:
        kill_if_alive(spawned.pid)


async def test_killed_connection_kills_ranks(sshd: SshdServer, tmp_path: Path) -> None:
    """Killing the SSH session on the node ends the agent's ranks within seconds."""
    t = transport(sshd, tmp_path)
    await t.connect()
    handle = await t.start_agent()
    rank = (await handle.spawn(Spawn(rank=0, argv=["sleep", "1000"]))).pid
    assert handle.hello is not None
    try:
        for pid in sshd.session_pids(handle.hello.pid):
            os.kill(pid, signal.SIGKILL)
        assert await wait_gone(rank, timeout=10.0)
        assert await wait_gone(handle.hello.pid, timeout=10.0)
        lost = await asyncio.wait_for(handle.finished, 15.0)
        assert lost.reason
    finally:
        kill_if_alive(rank)
        await t.close()


async def test_frozen_link_noticed_on_both_sides(sshd: SshdServer, tmp_path: Path) -> None:
    """A silent link: keepalives end the connection here, the lease ends the ranks there."""
    t = transport(sshd, tmp_path)
    await t.connect()
    handle = await t.start_agent(lease_s=2.0, grace_s=1.0)
    rank = (await handle.spawn(Spawn(rank=0, argv=["sleep", "1000"]))).pid
    assert handle.hello is not None
    session = sshd.session_pids(handle.hello.pid)
    try:
        for pid in session:
            os.kill(pid, signal.SIGSTOP)  # TCP stays open, nothing answers
        lost = await asyncio.wait_for(handle.finished, 15.0)  # keepalive: 1 s x 2
        assert lost.reason
        assert await wait_gone(rank, timeout=10.0)  # lease 2 s, then SIGTERM
    finally:
        for pid in session:
            kill_if_alive(pid)
        kill_if_alive(rank)
        await t.close()


async def test_unknown_host_key_refused(sshd: SshdServer, tmp_path: Path) -> None:
    """An unknown host key is refused with the command that adds it; nothing is written."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(TransportError) as err:
        async with transport(sshd, tmp_path, known_hosts=str(empty)):
            pass
    assert err.value.kind == ErrorKind.HOST_KEY
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in err.value.message
    assert "accept_new_host_keys" in err.value.message
    assert empty.read_text() == ""


async def test_accept_new_host_key_adds_it(sshd: SshdServer, tmp_path: Path) -> None:
    """accept_new_host_keys appends an unknown key, then the strict mode accepts it."""
    path = tmp_path / "ssh" / "known_hosts"  # the directory does not exist yet
    async with transport(sshd, tmp_path, known_hosts=str(path), accept_new_host_keys=True) as t:
        await t.deploy()
    assert path.read_text().split() == sshd.host_key_line.split()
    async with transport(sshd, tmp_path, known_hosts=str(path)) as strict:
        await strict.deploy()


async def test_changed_host_key_refused_even_with_accept_new(
    sshd: SshdServer, tmp_path: Path
) -> None:
    """A changed host key is never accepted, whatever accept_new_host_keys says."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    alg, blob = other.with_suffix(".pub").read_text().split()[:2]
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:{sshd.port} {alg} {blob}\n")
    before = path.read_text()
    with pytest.raises(TransportError) as err:
        async with transport(sshd, tmp_path, known_hosts=str(path), accept_new_host_keys=True):
            pass
    assert err.value.kind == ErrorKind.HOST_KEY and "CHANGED" in err.value.message
    assert "ssh-keygen -R" in err.value.message
    assert path.read_text() == before


async def test_hostile_python_does_not_execute_remotely(sshd: SshdServer, tmp_path: Path) -> None:
    """Shell syntax in node.python reaches the remote shell quoted: nothing runs."""
    marker = tmp_path / "pwned"
    for python in (f"python3; touch {marker}", f"$(touch {marker})", f"`touch {marker}`"):
        async with transport(sshd, tmp_path, python=python) as t:
            with pytest.raises(TransportError) as err:
                await t.start_agent()
            assert err.value.kind == ErrorKind.AGENT_START
            assert "exit status 127" in err.value.message  # command not found
    assert not marker.exists()
    async with transport(sshd, tmp_path, python="-c") as t:
        with pytest.raises(TransportError) as opt:
            await t.start_agent()
        assert opt.value.kind == ErrorKind.CONFIG


async def test_wrong_key_is_an_auth_error(sshd: SshdServer, tmp_path: Path) -> None:
    """A key the server does not accept is reported as an authentication failure."""
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(TransportError) as err:
        async with transport(sshd, tmp_path, identity_file=str(stranger)):
            pass
    assert err.value.kind == ErrorKind.AUTH and str(stranger) in err.value.message


async def test_closed_port_is_refused(sshd: SshdServer, tmp_path: Path) -> None:
    """Nothing listening on the port is reported as refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError) as err:
        async with transport(sshd, tmp_path, ssh_port=port):
            pass
    assert err.value.kind == ErrorKind.REFUSED and f"127.0.0.1:{port}" in err.value.message


async def test_sftp_deploy_replaces_an_unmarked_copy(sshd: SshdServer, tmp_path: Path) -> None:
    """A remote code dir without its marker (a half copy) is replaced by a full one."""
    t = transport(sshd, tmp_path)
    digest = CodeBundle.from_local().digest
    broken = tmp_path / "remote-cache" / digest
    broken.mkdir(parents=True)
    (broken / "junk.py").write_text("half a copy\n")
    async with t:
        deployed = await t.deploy()
    assert deployed.copied_files > 0
    assert not (broken / "junk.py").exists() and (broken / DIGEST_FILE).is_file()
