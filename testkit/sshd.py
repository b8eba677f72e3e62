"""A real OpenSSH sshd on 127.0.0.1 for tests (conftest.py imports its fixture).

`sshd` (session scope) starts /usr/sbin/sshd -D -e with its own config, host key
and user key in a temp dir, on a free port of 127.0.0.1, and stops it by PID.
Remote commands run as the current user (root in CI: PermitRootLogin
prohibit-password), so the remote python is this test run's own interpreter.
Without /usr/sbin/sshd the tests that use it skip, unless
ORCHESTRATOR_TESTS_REQUIRE_SSHD=1 (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.config import NodeSpec
from testkit import require
from testkit.ports import free_port
from testkit.require import missing

SSHD = Path("/usr/sbin/sshd")
START_TIMEOUT_S = 10.0


@dataclass
class SshdServer:
    host: str
    port: int
    user: str
    dir: Path
    user_key: Path  # private key accepted by the server
    known_hosts: Path  # holds the server's host key
    host_key_line: str  # "[127.0.0.1]:port ssh-ed25519 AAAA..."
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def node(self, name: str = "sshnode", **overrides: Any) -> NodeSpec:
        """A NodeSpec that reaches this server with the test key and known_hosts."""
        fields: dict[str, Any] = {
            "name": name,
            "transport": "ssh",
            "ssh": f"{self.user}@{self.host}",
            "ssh_port": self.port,
            "identity_file": str(self.user_key),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,
        }
        fields.update(overrides)
        return NodeSpec(**fields)

    def session_pids(self, remote_pid: int) -> list[int]:
        """PIDs of the sshd processes serving the connection that runs remote_pid."""
        chain: list[int] = []
        for parent in psutil.Process(remote_pid).parents():
            if parent.pid == self.pid:
                return chain
            chain.append(parent.pid)
        raise LookupError(f"pid {remote_pid} does not run under sshd {self.pid}")

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")


def keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def sshd_config(d: Path, host: str, port: int) -> Path:
    """A config for one test sshd: its own host key, pid file and authorized_keys in d."""
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        f"ListenAddress {host}\n"
        f"HostKey {d / 'host_ed25519'}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "PrintMotd no\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel VERBOSE\n"
    )
    return config


def wait_listening(proc: subprocess.Popen[bytes], host: str, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"sshd did not listen on {port} within {START_TIMEOUT_S} s:\n{log.read_text()}"
    )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """End the listener and any session process still under it, by PID."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def run_sshd(d: Path) -> Iterator[SshdServer]:
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        Path("/run/sshd").mkdir(mode=0o755)  # sshd's privilege separation dir
    port = free_port()
    host_pub = keygen(d / "host_ed25519")
    user_pub = keygen(d / "id_ed25519")
    (d / "authorized_keys").write_text(user_pub + "\n")
    alg, blob = host_pub.split()[:2]
    line = f"[127.0.0.1]:{port} {alg} {blob}"
    (d / "known_hosts").write_text(line + "\n")
    log = d / "sshd.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(sshd_config(d, "127.0.0.1", port))],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(proc, "127.0.0.1", port, log)
        yield SshdServer(
            host="127.0.0.1",
            port=port,
            user=getpass.getuser(),
            dir=d,
            user_key=d / "id_ed25519",
            known_hosts=d / "known_hosts",
            host_key_line=line,
            process=proc,
        )
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    """A running OpenSSH server on 127.0.0.1 (skips without /usr/sbin/sshd, unless required)."""
    if not SSHD.is_file() or shutil.which("ssh-keygen") is None:
        missing(f"{SSHD} or ssh-keygen is missing (apt-get install openssh-server)",
                require.SSHD)
    with run_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server
