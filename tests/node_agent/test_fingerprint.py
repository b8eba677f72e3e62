"""The fingerprint of this machine, and how it degrades without psutil or RDMA tools."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from contract.fingerprint import MemoryInfo, NodeFingerprint, OsInfo, PythonInfo
from node_agent import fingerprint
from node_agent.fingerprint import collect_fingerprint, probe_rdma
from node_agent.probes import macos
from node_agent.probes.tools import run_tool
from testkit import paths

ROOT = paths.ROOT
FIXTURES = ROOT / "tests" / "fixtures" / "node_tools"


def test_this_machine() -> None:
    """Hostname, Linux from os-release, memory, loopback address and mlx are reported."""
    fp = collect_fingerprint(None, "digest")
    assert fp.hostname == socket.gethostname()
    assert fp.os.system == "Linux" and fp.os.name and fp.os.kernel
    assert fp.cpu_count and fp.chip
    assert (
        fp.memory
        and fp.memory.available_bytes
        and fp.memory.total_bytes >= fp.memory.available_bytes
    )
    assert "127.0.0.1" in fp.addresses()
    assert fp.packages["mlx"] and fp.packages["mlx-lm"] and fp.packages["mlx-metal"] is None
    assert fp.python.executable == sys.executable
    assert fp.gpu_wired_limit_mb is None  # macOS only
    assert fp.code_digest == "digest"
    assert fp.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_model_path_sets_disk_probe(tmp_path: Path) -> None:
    """With a model path, free disk is measured where the model lives."""
    fp = collect_fingerprint(str(tmp_path), None)
    assert fp.model is not None and fp.model.exists
    assert fp.disk is not None and fp.disk.path == str(tmp_path)


def test_without_psutil_degrades() -> None:
    """A node python without psutil still reports memory and interface names, and says why."""
    code = (
        "import sys; sys.modules['psutil'] = None\n"
        "import msgspec\n"
        "from node_agent.fingerprint import collect_fingerprint\n"
        "print(msgspec.json.encode(collect_fingerprint(None, None)).decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    fp = json.loads(out.stdout)
    assert "psutil" in fp["unavailable"]
    assert fp["memory"]["total_bytes"] > 0
    assert "lo" in {i["name"] for i in fp["interfaces"]}


def _tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_rdma_probe_runs_the_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rdma_ctl, ibv_devices and `ibv_devinfo -v` outputs end up in the fingerprint."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "rdma_ctl", '[ "$1" = status ] && echo enabled\n')
    _tool(bin_dir, "ibv_devices", f"cat {FIXTURES / 'ibv_devices_m4pro_mini.txt'}\n")
    _tool(bin_dir, "ibv_devinfo", f'[ "$1" = -v ] && cat {FIXTURES / "ibv_devinfo_v_active.txt"}\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    unavailable: dict[str, str] = {}
    info = probe_rdma(unavailable)
    assert info.status == "enabled" and unavailable == {}
    assert info.device_names == ["rdma_en2", "rdma_en3", "rdma_en4"]
    assert [d.name for d in info.devices if d.active] == ["rdma_en3", "rdma_en4"]


def test_rdma_probe_failures_are_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing tool is a reason; "No IB devices found" just means no device."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "rdma_ctl", "echo 'rdma_ctl: not permitted' >&2; exit 1\n")
    _tool(bin_dir, "ibv_devices", "exit 0\n")
    _tool(bin_dir, "ibv_devinfo", "echo 'No IB devices found' >&2; exit 255\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    unavailable: dict[str, str] = {}
    info = probe_rdma(unavailable)
    assert info.status == "unavailable" and "not permitted" in (info.reason or "")
    assert info.devices == [] and info.device_names == [] and unavailable == {}


def test_missing_tool_is_a_reason_not_a_crash() -> None:
    """A tool that is not installed yields its reason."""
    out = run_tool(["definitely-not-a-tool-xyz"])
    assert out.stdout is None and "not found on PATH" in (out.reason or "")
    assert shutil.which("sw_vers") is None  # the macOS parsers are covered by fixtures instead


def test_working_set_probe_runs_mlx_in_the_nodes_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent asks its own Python (the ranks' mlx) for Metal's working set, once per
    wired limit; where MLX has no Metal (this Linux machine: {}) it is a reason."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "sysctl", "echo 0\n")
    _tool(bin_dir, "fake-python", f"cat {FIXTURES / 'mlx_device_info_m5max_128gb.txt'}\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(fingerprint, "_working_sets", {})
    real_python = sys.executable
    monkeypatch.setattr(sys, "executable", str(bin_dir / "fake-python"))
    unavailable: dict[str, str] = {}
    assert fingerprint._working_set(unavailable) == 115448725504 and unavailable == {}
    monkeypatch.setattr(sys, "executable", real_python)  # cached: not rerun
    assert fingerprint._working_set(unavailable) == 115448725504
    monkeypatch.setattr(fingerprint, "_working_sets", {})
    with pytest.raises(ValueError, match="max_recommended_working_set_size"):
        fingerprint._working_set(unavailable)  # the agent's guard turns it into a reason


def test_usable_memory_follows_the_wired_limit_then_the_working_set() -> None:
    """macOS: iogpu.wired_limit_mb when set, else Metal's working set (recorded 128 GB M5
    Max: 84%), else 75% of RAM; never more than is available."""
    ram = 137438953472
    base = NodeFingerprint(
        hostname="m",
        os=OsInfo(system="Darwin", name="macOS", version="26.2", kernel="25.2.0"),
        arch="arm64",
        memory=MemoryInfo(total_bytes=ram, available_bytes=130 * 2**30),
        python=PythonInfo(version="3.12.8", executable="/p", implementation="CPython"),
    )
    working_set = macos.parse_working_set_bytes(
        (FIXTURES / "mlx_device_info_m5max_128gb.txt").read_text()
    )
    replace = msgspec.structs.replace
    assert replace(base, gpu_working_set_bytes=working_set).usable_memory_bytes() == working_set
    assert base.usable_memory_bytes() == int(ram * 0.75)
    limited = replace(base, gpu_working_set_bytes=working_set, gpu_wired_limit_mb=120000)
    assert limited.usable_memory_bytes() == 120000 * 2**20
    assert replace(base, gpu_wired_limit_mb=200000).usable_memory_bytes() == 130 * 2**30
