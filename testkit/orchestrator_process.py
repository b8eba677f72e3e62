"""Runs a real `orchestrator up` in a subprocess for end-to-end tests, and ends it by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import tomli_w

from testkit.http_tls import default_tls
from testkit.paths import ROOT
from testkit.ports import cluster_ports
from testkit.waiting import wait_healthy


def write_cluster(
    tmp: Path, model_path: str, nodes: list[dict[str, Any]], **sections: dict[str, Any]
) -> Path:
    """A cluster.toml on free ports (each its own), with its state dir under tmp."""
    rank_port, api_port, rank_api_port = cluster_ports(len(nodes))
    data: dict[str, Any] = {
        "cluster": {
            "name": "test",
            "state_dir": str(tmp / "state"),
            "rank_port": rank_port,
        },
        "model": {"path": model_path},
        "api": {"host": "127.0.0.1", "port": api_port},
        "serving": {"rank_api_port": rank_api_port, "keepalive_s": 1.0},
        "supervisor": {"stop_grace_s": 3.0, "launch_timeout_s": 300.0},
        "nodes": nodes,
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp / "cluster.toml"
    path.write_text(tomli_w.dumps(data))
    return path


class Orchestrator:
    """`orchestrator up` as a child in its own session; its output kept for assertions,
    each line also with the time it arrived (benchmarks time milestones by them)."""

    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.output: list[str] = []
        self.lines: list[tuple[float, str]] = []  # (time.monotonic() on arrival, line)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "up", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.descendants: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.output.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.output)

    def remember_descendants(self) -> set[int]:
        """Every process under the orchestrator now (agents, ranks): to check they all end."""
        with contextlib.suppress(psutil.Error):
            self.descendants |= {
                child.pid for child in psutil.Process(self.process.pid).children(recursive=True)
            }
        return self.descendants

    def wait_ready(self, url: str, timeout_s: float = 600.0) -> None:
        if not wait_healthy(url, timeout_s, self._check_alive):
            raise AssertionError(f"not ready within {timeout_s} s:\n{self.text[-4000:]}")
        self.remember_descendants()

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"orchestrator exited {self.process.returncode}:\n{self.text}")

    def wait_exit(self, timeout_s: float = 120.0) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(5)
        return code

    def stop(self) -> None:
        """End its session; then make sure nothing it started lives on."""
        end_session(self.process)
        kill_all(self.descendants)


def end_session(process: subprocess.Popen[str]) -> None:
    """SIGTERM to an orchestrator; SIGKILL to its whole session if it has not exited in 60 s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.add(pid)
    return living


def wait_gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def launch_processes(*launch_ids: str) -> list[int]:
    """PIDs of live processes carrying one of these launch ids in their environment (ranks)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (
                process.environ().get("MLX_LAUNCH_ID") in launch_ids
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process.pid)
    return found


def wait_no_launch(launch_id: str, timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while launch_processes(launch_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    return launch_processes(launch_id)


def kill_all(pids: set[int]) -> None:
    for pid in alive(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running(
    config: Path, env: dict[str, str] | None = None, url: str = ""
) -> Iterator[Orchestrator]:
    orchestrator = Orchestrator(config, env)
    try:
        if url:
            orchestrator.wait_ready(url)
        yield orchestrator
    except BaseException:
        print("orchestrator output (last 150 lines):\n" + "\n".join(orchestrator.output[-150:]))
        raise
    finally:
        orchestrator.stop()


def gateway_status(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The gateway's /status: what `status --json` prints, without starting a Python (2-3 s
    of CPU that a poll loop takes from the ranks it waits for); {} while it does not answer."""
    try:
        return dict(httpx.get(f"{url}/status", headers=headers, timeout=5.0,
                              verify=default_tls()).json())
    except (httpx.HTTPError, ValueError):
        return {}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def rank0_headers(config: Path) -> dict[str, str]:
    """What a test must send to call rank 0 directly: the running launch's secret, as the
    gateway does (the orchestrator keeps it in the cluster's state dir)."""
    import tomllib

    from contract.launch_secret import HEADER
    from orchestrator.launch import launch_secret

    cluster = tomllib.loads(config.read_text())["cluster"]
    record = launch_secret.load(Path(cluster["state_dir"]), cluster["name"])
    assert record is not None, f"no launch secret kept for {config}: is the cluster up?"
    return {HEADER: record.secret}
