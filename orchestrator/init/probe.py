"""What `orchestrator init` learns about one host, by running its tools (no agent: a new
Mac may have no msgspec yet) and parsing their output with node_agent/probes.

Each command has a key (`uname`, `thunderbolt`...) so recorded outputs of real Macs can be
replayed through the same code (testkit/recorded_hosts.py). A tool that is missing or
fails leaves its field empty and a note saying why, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from contract.fingerprint import METAL_DEFAULT_WIRED_SHARE
from node_agent.probes import addresses, linux, macos, rdma, thunderbolt
from node_agent.probes.addresses import InterfaceAddresses
from orchestrator.transports.base import Completed

Runner = Callable[[str, list[str]], Awaitable[Completed]]

GIB = 1024**3
DEFAULT_SSH_PORT = 22
MAC_COMMANDS = {
    "chip": ["sysctl", "-n", "machdep.cpu.brand_string"],
    "memsize": ["sysctl", "-n", "hw.memsize"],
    "wired_limit": ["sysctl", "-n", "iogpu.wired_limit_mb"],
    "sw_vers": ["sw_vers"],
    "ifconfig": ["ifconfig"],
    "hardware_ports": ["networksetup", "-listallhardwareports"],
    "thunderbolt": ["system_profiler", "SPThunderboltDataType", "-json"],
    "rdma_ctl": ["rdma_ctl", "status"],
    "ibv_devices": ["ibv_devices"],
    "ibv_devinfo": ["ibv_devinfo"],
}
LINUX_COMMANDS = {
    "os_release": ["cat", "/etc/os-release"],
    "cpuinfo": ["cat", "/proc/cpuinfo"],
    "meminfo": ["cat", "/proc/meminfo"],
    "ip_addr": ["ip", "-j", "addr", "show"],
}
# Runs in the node's Python; stdlib only, so it answers before anything is installed. On a
# Mac it also asks MLX for Metal's working set (what the GPU may wire by default).
PYTHON_PROBE = """
import json, platform, sys, importlib.metadata as m
def v(d):
    try: return m.version(d)
    except Exception: return None
info = {"python": platform.python_version(), "executable": sys.executable,
        "mlx": v("mlx"), "mlx_lm": v("mlx-lm"), "working_set": None}
if sys.platform == "darwin" and info["mlx"]:
    try:
        import mlx.core as mx
        d = mx.device_info(mx.gpu) if hasattr(mx, "device_info") else mx.metal.device_info()
        info["working_set"] = int(d["max_recommended_working_set_size"])
    except Exception: pass
print(json.dumps(info))
"""


@dataclass
class PythonFound:
    version: str
    executable: str
    mlx: str | None
    mlx_lm: str | None
    working_set: int | None


@dataclass
class TbPort:
    """A Thunderbolt port of a Mac with the interface behind it (`en3`)."""

    port: thunderbolt.ThunderboltPort
    interface: str | None


@dataclass
class HostProbe:
    target: str  # as given, without a port: "me@studio-a.local", "local"
    ssh_port: int = DEFAULT_SSH_PORT
    system: str = "unknown"  # "Darwin", "Linux"
    os_name: str = ""
    os_version: str = ""
    chip: str | None = None
    memory_bytes: int | None = None
    wired_limit_mb: int | None = None
    python: PythonFound | None = None
    interfaces: list[InterfaceAddresses] = field(default_factory=list)
    thunderbolt: list[TbPort] = field(default_factory=list)
    rdma_status: str = "unavailable"  # rdma_ctl status: "enabled", "disabled"
    rdma_devices: list[str] = field(default_factory=list)  # ibv_devices
    rdma_active: list[str] = field(default_factory=list)  # devices with a PORT_ACTIVE port
    rdma_down: list[str] = field(default_factory=list)  # ibv_devinfo: no port active
    notes: list[str] = field(default_factory=list)  # what could not be probed, and why
    link_local: dict[str, str] = field(default_factory=dict)  # Linux: iface -> fe80::...
    neighbours: list[tuple[str, str]] = field(default_factory=list)  # neighbours.py

    @property
    def is_mac(self) -> bool:
        return self.system == "Darwin"

    def usable_memory_gb(self) -> float | None:
        """What the model and its KV cache may use: on a Mac the GPU's wired limit when set,
        else Metal's working set, else its default share of RAM; elsewhere the RAM."""
        if self.memory_bytes is None:
            return None
        usable = self.memory_bytes
        if self.is_mac:
            if self.wired_limit_mb:
                usable = self.wired_limit_mb * 1024**2
            elif self.python and self.python.working_set:
                usable = self.python.working_set
            else:
                usable = int(self.memory_bytes * METAL_DEFAULT_WIRED_SHARE)
        usable = min(usable, self.memory_bytes)
        return int(usable / GIB * 10) / 10  # rounded down: never above the node's memory


async def probe_host(target: str, run: Runner, python: str) -> HostProbe:
    host = HostProbe(target)
    uname = await _output(host, run, "uname", ["uname", "-s"])
    host.system = (uname or "unknown").strip() or "unknown"
    if host.is_mac:
        await _probe_mac(host, run)
    else:
        await _probe_linux(host, run)
    await _probe_python(host, run, python)
    return host


async def _output(host: HostProbe, run: Runner, key: str, argv: list[str]) -> str | None:
    try:
        done = await run(key, argv)
    except (OSError, TimeoutError) as exc:
        host.notes.append(f"{' '.join(argv)}: {exc}")
        return None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        why = detail[-1] if detail else f"exit status {done.returncode}"
        host.notes.append(f"{' '.join(argv)}: {why}")
        return None
    return done.stdout


async def _probe_mac(host: HostProbe, run: Runner) -> None:
    out = {key: await _output(host, run, key, argv) for key, argv in MAC_COMMANDS.items()}
    if out["sw_vers"]:
        sw = macos.parse_sw_vers(out["sw_vers"])
        host.os_name, host.os_version = sw.product_name, sw.product_version
    host.chip = macos.parse_sysctl_value(out["chip"]) if out["chip"] else None
    host.memory_bytes = macos.parse_sysctl_int(out["memsize"]) if out["memsize"] else None
    if out["wired_limit"]:
        host.wired_limit_mb = macos.parse_sysctl_int(out["wired_limit"])
    if out["ifconfig"]:
        host.interfaces = addresses.parse_ifconfig(out["ifconfig"])
    ports = thunderbolt.parse_hardware_ports(out["hardware_ports"] or "")
    if out["thunderbolt"]:
        host.thunderbolt = [
            TbPort(port, ports.get(f"Thunderbolt {port.receptacle}"))
            for port in thunderbolt.parse_thunderbolt(out["thunderbolt"])
        ]
    _apply_rdma(host, out["rdma_ctl"], out["ibv_devices"], out["ibv_devinfo"])


def _apply_rdma(host: HostProbe, ctl: str | None, names: str | None, info: str | None) -> None:
    if ctl:
        try:
            host.rdma_status = rdma.parse_rdma_ctl_status(ctl)
        except ValueError as exc:
            host.notes.append(str(exc))
    host.rdma_devices = rdma.parse_ibv_devices(names or "")
    devices = rdma.parse_ibv_devinfo(info or "")
    host.rdma_active = [d.name for d in devices if d.active]
    host.rdma_down = [d.name for d in devices if not d.active]


async def _probe_linux(host: HostProbe, run: Runner) -> None:
    out = {key: await _output(host, run, key, argv) for key, argv in LINUX_COMMANDS.items()}
    fields = linux.parse_os_release(out["os_release"] or "")
    host.os_name = fields.get("NAME", host.system)
    host.os_version = fields.get("VERSION_ID", "")
    host.chip = linux.parse_cpuinfo_model(out["cpuinfo"] or "")
    for line in (out["meminfo"] or "").splitlines():
        if line.startswith("MemTotal:"):
            host.memory_bytes = int(line.split()[1]) * 1024  # kB
    if out["ip_addr"]:
        host.interfaces = addresses.parse_ip_addr_json(out["ip_addr"])
        host.link_local = _link_local(out["ip_addr"])


def _link_local(ip_addr_json: str) -> dict[str, str]:
    """Each interface's IPv6 link-local address: how neighbours.py finds bare cables."""
    found: dict[str, str] = {}
    for link in json.loads(ip_addr_json):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet6" and info.get("scope") == "link":
                found.setdefault(link["ifname"], info["local"])
    return found


async def _probe_python(host: HostProbe, run: Runner, python: str) -> None:
    out = await _output(host, run, "python", [python, "-c", PYTHON_PROBE])
    if not out:
        return
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        host.notes.append(f"{python}: unexpected output {out[:200]!r}")
        return
    host.python = PythonFound(info["python"], info["executable"], info.get("mlx"),
                              info.get("mlx_lm"), info.get("working_set"))
