"""The RDMA holder finder on real processes: one holding a stand-in device file open, one
with JACCL's env and a launch id, and one that holds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.rank_env import IBV_DEVICES, LAUNCH_ID
from node_agent.rdma_holders import find_holders

HOLD = "import sys, time; f = open(sys.argv[1], 'rb') if len(sys.argv) > 1 else None; " \
       "print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait(10)


def start(processes: list[subprocess.Popen[str]], *args: str, env: dict[str, str] | None = None
          ) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, *args], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})})
    processes.append(process)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_holders_by_open_device_file_and_by_jaccl_env(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """A process with the device open is found with the file; a JACCL rank of launch L1 by
    its env, with its launch id; a process holding neither is not listed."""
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").write_bytes(b"")
    holder = start(started, str(dev / "uverbs0"))
    rank = start(started, env={IBV_DEVICES: "devices.json", LAUNCH_ID: "L1"})
    bystander = start(started)
    found = {h.pid: h for h in find_holders([f"{dev}/"])}
    assert found[holder.pid].files == [str(dev / "uverbs0")]
    assert not found[holder.pid].jaccl_env and found[holder.pid].launch_id == ""
    assert found[holder.pid].command.startswith(sys.executable)
    assert found[rank.pid].jaccl_env and found[rank.pid].launch_id == "L1"
    assert found[rank.pid].files == []
    assert bystander.pid not in found and os.getpid() not in found


def test_a_holder_that_ended_is_no_longer_found(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """Once the holder is gone the device is free: nothing listed."""
    device = tmp_path / "uverbs0"
    device.write_bytes(b"")
    holder = start(started, str(device))
    assert [h.pid for h in find_holders([str(device)])] == [holder.pid]
    holder.kill()
    holder.wait(10)
    deadline = time.monotonic() + 5
    while find_holders([str(device)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert find_holders([str(device)]) == []
