"""Collect a node's fingerprint: OS, chip, memory, Python and MLX versions,
network addresses, RDMA devices, the model on disk and free space.

Blocking (runs node tools with timeouts); the agent calls it in a thread.
Every probe is guarded: a failure becomes `unavailable[probe] = reason`.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from contract.blas import describe_blas
from contract.fingerprint import (
    ModelInfo,
    NodeFingerprint,
    OsInfo,
    PythonInfo,
    RdmaInfo,
)
from node_agent.probes import linux, macos, rdma, system
from node_agent.probes.model import inspect_model
from node_agent.probes.tools import run_tool

PACKAGES = (
    "mlx",
    "mlx-lm",
    "mlx-metal",
    "mlx-cpu",
    "mlx-cluster-orchestrator",
    "msgspec",
    "psutil",
    # What rank 0 needs for its API and metrics.
    "litestar",
    "uvicorn",
    "prometheus-client",
)
T = TypeVar("T")


def collect_fingerprint(model: str | None, code_digest: str | None) -> NodeFingerprint:
    unavailable: dict[str, str] = {}

    def guard(probe: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as exc:  # a probe must never take the agent down
            unavailable[probe] = f"{type(exc).__name__}: {exc}"
            return None

    is_mac = platform.system() == "Darwin"
    psutil = system.load_psutil()
    if psutil is None:
        unavailable["psutil"] = (
            "psutil is not installed in this Python; memory and addresses are partial"
        )
    model_info = guard("model", lambda: inspect_model(model)) if model else None
    fp = NodeFingerprint(
        hostname=socket.gethostname(),
        os=_os_info(is_mac, unavailable),
        arch=platform.machine(),
        chip=guard("chip", lambda: _chip(is_mac, unavailable)),
        cpu_count=os.cpu_count(),
        boot_id=guard("boot_id", _boot_id) if not is_mac else None,
        memory=guard("memory", lambda: system.memory(psutil)),
        gpu_wired_limit_mb=guard("gpu_wired_limit", lambda: _wired_limit(unavailable))
        if is_mac
        else None,
        gpu_working_set_bytes=guard("gpu_working_set", lambda: _working_set(unavailable))
        if is_mac
        else None,
        blas=describe_blas(),
        python=PythonInfo(
            version=platform.python_version(),
            executable=sys.executable,
            implementation=platform.python_implementation(),
        ),
        packages={name: _version(name) for name in PACKAGES},
        code_digest=code_digest,
        interfaces=guard("interfaces", lambda: system.interfaces(psutil)) or [],
        rdma=guard("rdma", lambda: probe_rdma(unavailable)),
        model=model_info,
        unavailable=unavailable,
    )
    fp.disk = guard("disk", lambda: system.disk(_disk_path(model_info)))
    return fp


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _os_info(is_mac: bool, unavailable: dict[str, str]) -> OsInfo:
    kernel = platform.release()
    if is_mac:
        out = run_tool(["sw_vers"])
        if out.stdout is not None:
            sw = macos.parse_sw_vers(out.stdout)
            return OsInfo(
                system="Darwin",
                name=sw.product_name,
                version=sw.product_version,
                build=sw.build_version,
                kernel=kernel,
            )
        unavailable["os"] = out.reason or "sw_vers failed"
        return OsInfo(system="Darwin", name="macOS", version=platform.mac_ver()[0], kernel=kernel)
    try:
        fields = linux.parse_os_release(Path("/etc/os-release").read_text())
    except OSError as exc:
        unavailable["os"] = f"/etc/os-release: {exc}"
        fields = {}
    return OsInfo(
        system=platform.system(),
        name=fields.get("NAME", platform.system()),
        version=fields.get("VERSION_ID", fields.get("VERSION", "")),
        kernel=kernel,
    )


def _chip(is_mac: bool, unavailable: dict[str, str]) -> str | None:
    if is_mac:
        out = run_tool(["sysctl", "-n", "machdep.cpu.brand_string"])
        if out.stdout is None:
            unavailable["chip"] = out.reason or "sysctl failed"
            return None
        return macos.parse_sysctl_value(out.stdout, "machdep.cpu.brand_string")
    try:
        return linux.parse_cpuinfo_model(Path("/proc/cpuinfo").read_text()) or platform.processor()
    except OSError:
        return platform.processor() or None


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _wired_limit(unavailable: dict[str, str]) -> int | None:
    out = run_tool(["sysctl", "-n", "iogpu.wired_limit_mb"])
    if out.stdout is None:
        unavailable["gpu_wired_limit"] = out.reason or "sysctl failed"
        return None
    return macos.parse_sysctl_int(out.stdout, "iogpu.wired_limit_mb")


# Importing mlx and opening the Metal device takes a second or two; the value only
# changes with iogpu.wired_limit_mb (Metal's recommendation follows it), so it is cached.
WORKING_SET_TIMEOUT_S = 30.0
_working_sets: dict[str, int] = {}


def _working_set(unavailable: dict[str, str]) -> int | None:
    limit = run_tool(["sysctl", "-n", "iogpu.wired_limit_mb"]).stdout or ""
    if limit in _working_sets:
        return _working_sets[limit]
    out = run_tool([sys.executable, "-c", macos.DEVICE_INFO_PROBE], WORKING_SET_TIMEOUT_S)
    if out.stdout is None:
        unavailable["gpu_working_set"] = out.reason or "mlx device_info failed"
        return None
    _working_sets[limit] = macos.parse_working_set_bytes(out.stdout)
    return _working_sets[limit]


def probe_rdma(unavailable: dict[str, str]) -> RdmaInfo:
    ctl = run_tool(["rdma_ctl", "status"])
    if ctl.stdout is not None:
        try:
            info = RdmaInfo(status=rdma.parse_rdma_ctl_status(ctl.stdout))
        except ValueError as exc:
            info = RdmaInfo(status="unavailable", reason=str(exc))
    else:
        info = RdmaInfo(status="unavailable", reason=ctl.reason)
    names = run_tool(["ibv_devices"])
    if names.stdout is not None:
        info.device_names = rdma.parse_ibv_devices(names.stdout)
    elif rdma.NO_DEVICES not in (names.reason or ""):
        unavailable["ibv_devices"] = names.reason or "ibv_devices failed"
    devinfo = run_tool(["ibv_devinfo", "-v"])
    if devinfo.stdout is not None:
        info.devices = rdma.parse_ibv_devinfo(devinfo.stdout)
    elif rdma.NO_DEVICES not in (devinfo.reason or ""):
        unavailable["ibv_devinfo"] = devinfo.reason or "ibv_devinfo failed"
    return info


def _disk_path(model: ModelInfo | None) -> Path:
    if model is not None and model.path:
        return Path(model.path)
    return Path.home()
