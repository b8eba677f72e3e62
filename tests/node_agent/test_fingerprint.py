"""The fingerprint of this machine, and how it degrades without psutil or RDMA tools."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.fingerprint import collect_fingerprint, probe_rdma
from node_agent.probes.tools import run_tool

ROOT = Path(__file__).resolve().parents[2]
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
