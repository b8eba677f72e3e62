"""Several hosts on one machine: Linux network namespaces, each with its own OpenSSH sshd.

    root namespace (the orchestrator) ── management bridge <prefix>m, 198.18.R.254/24
        │ veth "mgmt" in each host: 198.18.R.(i+1)      (SSH, rank 0's API, agents)
    host i = namespace <prefix>-h<i>
        data network, one of:
        switch: veth "data" into bridge <prefix>d, 198.19.R.(i+1)/24 (one subnet)
        ring:   a veth pair per neighbouring pair ("c<j>" in host i faces host j), each
                pair its own /30: a Thunderbolt ring of Macs, a different address per cable
        bare-ring: the same cables, up, with no IPv4 address (as cabled; init --apply)

Only connected routes exist; the root namespace has none into the data network (it is
marked unreachable there, so nothing can leak out of the machine). Every name carries a
per-run prefix; `multi_host()` removes every namespace, link, bridge, route and process
it made, also when the test fails. Faults (`link_down`, `drop_all`, `shape`) apply to data
links only, so SSH keeps working while a cable is cut. This machine's kernel has tbf but
not netem, so loss is "drop every packet" and there is no added delay.

Namespaces share one file system. A host given a `PrivateTmpfs` runs its sshd (and so
everything started over SSH) in its own mount namespace with a tmpfs of that size at that
path: hosts then hold different files there (model copies), and a small size makes a
small disk. `Host.path()` reaches into it from the root namespace (/proc/<sshd>/root).
"""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import os
import random
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil
import pytest

from testkit import require
from testkit.require import missing
from testkit.sshd import SSHD, keygen, sshd_config, stop_process, wait_listening

Topology = Literal["switch", "ring", "bare-ring"]
IP = "/usr/sbin/ip"
TC = "/usr/sbin/tc"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class PrivateTmpfs:
    """A tmpfs only this host sees, mounted at path (an absolute directory)."""

    path: str
    size: str = "256m"  # tmpfs size= (bytes, or k/m/g)


@dataclass
class Host:
    index: int
    ns: str
    mgmt_ip: str
    # Data addresses: switch: {-1: ip}; ring: {peer index: this host's address on that cable}.
    data_ips: dict[int, str] = field(default_factory=dict)
    sshd: subprocess.Popen[bytes] | None = None
    tmpfs: PrivateTmpfs | None = None

    def path(self, path: str | Path) -> Path:
        """path as this host sees it (its private tmpfs included), from the root namespace."""
        assert self.sshd is not None, "the host's sshd is not running"
        return Path(f"/proc/{self.sshd.pid}/root") / Path(path).relative_to("/")

    @property
    def name(self) -> str:
        return f"h{self.index}"

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside this host's namespace."""
        return subprocess.run(
            [IP, "netns", "exec", self.ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pids(self) -> list[int]:
        out = sh(IP, "netns", "pids", self.ns, check=False).stdout
        return [int(pid) for pid in out.split()]


@dataclass
class MultiHost:
    prefix: str
    topology: Topology
    hosts: list[Host]
    dir: Path
    user_key: Path
    known_hosts: Path
    mgmt_net: ipaddress.IPv4Network
    data_net: ipaddress.IPv4Network

    def data_ip(self, i: int) -> str:
        """The address ranks reach host i at: switch: its one address; ring: its address on
        the cable to the previous host (where MLX's ring has rank i listen)."""
        host = self.hosts[i]
        peer = -1 if self.topology == "switch" else (i - 1) % len(self.hosts)
        return host.data_ips[peer]

    def mgmt_bytes_in(self, i: int) -> int:
        """Bytes delivered into host i over its management link (SSH, so sync's copies):
        the kernel's counter on our end of its veth, whatever the sender reports."""
        counter = Path(f"/sys/class/net/{self.prefix}m{i}/statistics/tx_bytes")
        return int(counter.read_text())

    def only_sshd_left(self, within_s: float = 30.0) -> bool:
        """Within within_s, nothing but its sshd runs in any host: agents and ranks are all
        gone."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            sshds = {host.sshd.pid if host.sshd else 0 for host in self.hosts}
            if not any(set(host.pids()) - sshds for host in self.hosts):
                return True
            time.sleep(0.3)
        return False

    def node(self, i: int, **overrides: Any) -> dict[str, Any]:
        """A cluster.toml [[nodes]] table reaching host i over SSH with strict host keys."""
        table: dict[str, Any] = {
            "name": self.hosts[i].name,
            "transport": "ssh",
            "ssh": f"{getpass.getuser()}@{self.hosts[i].mgmt_ip}",
            "identity_file": str(self.user_key),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,
        }
        if self.topology == "switch":
            table["ip"] = self.data_ip(i)
        table.update(overrides)
        return table

    def links(self) -> list[dict[str, Any]]:
        """cluster.toml [[links]] tables of the ring's cables (ring topology only)."""
        size = len(self.hosts)
        pairs = [(i, (i + 1) % size) for i in range(size if size > 2 else 1)]
        return [
            {
                "between": [self.hosts[i].name, self.hosts[j].name],
                "ips": [self.hosts[i].data_ips[j], self.hosts[j].data_ips[i]],
            }
            for i, j in pairs
        ]

    # ── faults on data links ──

    def _ends(self, i: int, j: int | None) -> list[tuple[str | None, str]]:
        """(namespace or None for root, interface) of both ends of a data link."""
        if self.topology == "switch":
            return [(self.hosts[i].ns, "data"), (None, f"{self.prefix}d{i}")]
        assert j is not None, "a ring link is named by both its hosts"
        return [(self.hosts[i].ns, f"c{j}"), (self.hosts[j].ns, f"c{i}")]

    def link_down(self, i: int, j: int | None = None) -> None:
        for ns, dev in self._ends(i, j):
            sh(*_in(ns), "link", "set", dev, "down")

    def link_up(self, i: int, j: int | None = None) -> None:
        for ns, dev in self._ends(i, j):
            sh(*_in(ns), "link", "set", dev, "up")

    def drop_all(self, i: int, j: int | None = None) -> None:
        """100% loss with the link up: a token bucket smaller than any packet drops every
        one (this kernel has no netem; the effect on TCP is the same: silence)."""
        self._qdisc(i, j, "tbf rate 8bit burst 10 limit 10")

    def shape(self, i: int, j: int | None = None, rate: str = "200mbit") -> None:
        """Limit the link to `rate` each way (a slower cable)."""
        self._qdisc(i, j, f"tbf rate {rate} burst 256kb latency 200ms")

    def clear(self, i: int, j: int | None = None) -> None:
        for ns, dev in self._ends(i, j):
            sh(*_tc(ns), "qdisc", "del", "dev", dev, "root", check=False)

    def shape_mgmt(self, i: int, rate: str | None) -> None:
        """Limit host i's management link (its SSH) to rate each way; None lifts it."""
        for ns, dev in ((self.hosts[i].ns, "mgmt"), (None, f"{self.prefix}m{i}")):
            if rate is None:
                sh(*_tc(ns), "qdisc", "del", "dev", dev, "root", check=False)
            else:
                spec = f"tbf rate {rate} burst 256kb latency 200ms"
                sh(*_tc(ns), "qdisc", "replace", "dev", dev, "root", *spec.split())

    def _qdisc(self, i: int, j: int | None, spec: str) -> None:
        for ns, dev in self._ends(i, j):
            sh(*_tc(ns), "qdisc", "replace", "dev", dev, "root", *spec.split())


def _tc(ns: str | None) -> list[str]:
    return [TC, "-n", ns] if ns else [TC]


def _in(ns: str | None) -> list[str]:
    return [IP, "-n", ns] if ns else [IP]


def usable() -> str | None:
    """Why multi-host tests cannot run here (None: they can)."""
    if getpass.getuser() != "root":
        return "network namespaces need root"
    if not (Path(IP).exists() and Path(TC).exists()):
        return "iproute2 is missing (apt-get install iproute2)"
    if not SSHD.is_file():
        return f"{SSHD} is missing (apt-get install openssh-server)"
    probe = f"mcoprobe{secrets.token_hex(2)}"
    if sh(IP, "netns", "add", probe, check=False).returncode != 0:
        return "ip netns add failed"
    sh(IP, "netns", "del", probe, check=False)
    return None


def _free_subnets() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """A /24 of 198.18/15 (the benchmarking range) for each network, routed nowhere yet."""
    routes = sh(IP, "route", "show", "table", "all", check=False).stdout
    # Tests running at once (pytest-xdist's workers) draw from disjoint octets: two that
    # look at the routes together cannot both take one subnet.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    octets = range(worker, 256, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    for _ in range(100):
        third = random.choice(octets)
        mgmt, data = f"198.18.{third}.", f"198.19.{third}."
        if mgmt not in routes and data not in routes:
            return (ipaddress.IPv4Network(f"{mgmt}0/24"), ipaddress.IPv4Network(f"{data}0/24"))
    raise RuntimeError("no free 198.18.x.0/24 subnet")


TmpfsSpec = PrivateTmpfs | list[PrivateTmpfs | None] | None


@contextlib.contextmanager
def multi_host(
    count: int, topology: Topology, tmp_dir: Path, tmpfs: TmpfsSpec = None
) -> Iterator[MultiHost]:
    """`count` hosts joined as `topology`, each running sshd; all removed on exit.
    tmpfs: one PrivateTmpfs for every host, or one (or None) per host."""
    prefix = "mco" + secrets.token_hex(2)
    mgmt_net, data_net = _free_subnets()
    tmp_dir.mkdir(parents=True, exist_ok=True)
    mounts = tmpfs if isinstance(tmpfs, list) else [tmpfs] * count
    hosts = [
        Host(i, f"{prefix}-h{i}", str(mgmt_net.network_address + i + 1), tmpfs=mounts[i])
        for i in range(count)
    ]
    net = MultiHost(
        prefix, topology, hosts, tmp_dir, tmp_dir / "id_ed25519", tmp_dir / "known_hosts",
        mgmt_net, data_net,
    )
    try:
        _build(net)
        yield net
    finally:
        _teardown(net)


def _build(net: MultiHost) -> None:
    sh(IP, "link", "add", f"{net.prefix}m", "type", "bridge")
    sh(IP, "addr", "add", f"{net.mgmt_net.network_address + 254}/24", "dev", f"{net.prefix}m")
    sh(IP, "link", "set", f"{net.prefix}m", "up")
    # Anything in this namespace aimed at the data network fails here instead of leaving.
    sh(IP, "route", "add", "unreachable", str(net.data_net))
    for host in net.hosts:
        sh(IP, "netns", "add", host.ns)
        sh(IP, "-n", host.ns, "link", "set", "lo", "up")
        _veth_to_bridge(net, host, "mgmt", f"{net.prefix}m{host.index}", f"{net.prefix}m")
        sh(IP, "-n", host.ns, "addr", "add", f"{host.mgmt_ip}/24", "dev", "mgmt")
    if net.topology == "switch":
        _switch(net)
    else:
        _ring(net, addressed=net.topology == "ring")
    keygen(net.user_key)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    lines = [_start_sshd(net, host) for host in net.hosts]
    net.known_hosts.write_text("".join(f"{line}\n" for line in lines))


def _veth_to_bridge(net: MultiHost, host: Host, inside: str, outside: str, bridge: str) -> None:
    sh(IP, "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", host.ns)
    sh(IP, "link", "set", outside, "master", bridge, "up")
    sh(IP, "-n", host.ns, "link", "set", inside, "up")


def _switch(net: MultiHost) -> None:
    bridge = f"{net.prefix}d"
    sh(IP, "link", "add", bridge, "type", "bridge")
    sh(IP, "link", "set", bridge, "up")
    for host in net.hosts:
        _veth_to_bridge(net, host, "data", f"{net.prefix}d{host.index}", bridge)
        address = str(net.data_net.network_address + host.index + 1)
        sh(IP, "-n", host.ns, "addr", "add", f"{address}/24", "dev", "data")
        host.data_ips[-1] = address


def _ring(net: MultiHost, addressed: bool = True) -> None:
    """A /30 per cable (none if not addressed): .4k+1 on host i's side, .4k+2 on j's."""
    size = len(net.hosts)
    for k, i in enumerate(range(size if size > 2 else 1)):
        j = (i + 1) % size
        a, b = net.hosts[i], net.hosts[j]
        sh(IP, "link", "add", f"c{j}", "netns", a.ns, "type", "veth", "peer", "name", f"c{i}",
           "netns", b.ns)
        base = net.data_net.network_address + 4 * k
        for host, peer, address in ((a, j, base + 1), (b, i, base + 2)):
            if addressed:
                sh(IP, "-n", host.ns, "addr", "add", f"{address}/30", "dev", f"c{peer}")
                host.data_ips[peer] = str(address)
            sh(IP, "-n", host.ns, "link", "set", f"c{peer}", "up")


def _start_sshd(net: MultiHost, host: Host) -> str:
    """Start the host's sshd; returns its known_hosts line."""
    d = net.dir / host.name
    d.mkdir(exist_ok=True)
    host_pub = keygen(d / "host_ed25519")
    (d / "authorized_keys").write_text(net.user_key.with_suffix(".pub").read_text())
    config = sshd_config(d, host.mgmt_ip, 22)
    log = d / "sshd.log"
    command = [str(SSHD), "-D", "-e", "-f", str(config)]
    if host.tmpfs is not None:
        Path(host.tmpfs.path).mkdir(parents=True, exist_ok=True)  # the mount point
        size, path = shlex.quote(host.tmpfs.size), shlex.quote(host.tmpfs.path)
        mount = f"mount -t tmpfs -o size={size} tmpfs {path}"
        # The mount namespace ends with its last process: teardown's kills unmount it.
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f"{mount} && exec {shlex.join(command)}"]
    with log.open("wb") as log_file:
        host.sshd = subprocess.Popen([IP, "netns", "exec", host.ns, *command],
                                     stdin=subprocess.DEVNULL, stdout=log_file,
                                     stderr=subprocess.STDOUT)
    wait_listening(host.sshd, host.mgmt_ip, 22, log)
    alg, blob = host_pub.split()[:2]
    return f"{host.mgmt_ip} {alg} {blob}"


def _teardown(net: MultiHost) -> None:
    for host in net.hosts:
        if host.sshd is not None:
            stop_process(host.sshd)
        _kill_all(host)
        # The kernel frees a namespace's devices lazily: delete our ends of its veths now.
        for port in (f"{net.prefix}m{host.index}", f"{net.prefix}d{host.index}"):
            sh(IP, "link", "del", port, check=False)
        sh(IP, "netns", "del", host.ns, check=False)
    for name in (f"{net.prefix}m", f"{net.prefix}d"):
        sh(IP, "link", "del", name, check=False)
    sh(IP, "route", "del", "unreachable", str(net.data_net), check=False)


def _kill_all(host: Host) -> None:
    """Every process still in the namespace (agents, ranks), by PID: TERM, then KILL."""
    pids = host.pids()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).terminate()
    deadline = time.monotonic() + 5.0
    while host.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in host.pids():
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


class HostsFactory(Protocol):
    def __call__(self, count: int, topology: Topology, tmpfs: TmpfsSpec = None) -> MultiHost: ...


@pytest.fixture
def netns_hosts(tmp_path: Path) -> Iterator[HostsFactory]:
    """`netns_hosts(3, "ring")`: hosts for this test, torn down after it, whatever happens.
    Skips where namespaces cannot be made, unless ORCHESTRATOR_TESTS_REQUIRE_NETNS=1 (CI)."""
    reason = usable()
    if reason is not None:
        missing(reason, require.NETNS)
    with contextlib.ExitStack() as stack:
        made = 0

        def make(count: int, topology: Topology, tmpfs: TmpfsSpec = None) -> MultiHost:
            nonlocal made
            made += 1
            return stack.enter_context(
                multi_host(count, topology, tmp_path / f"hosts{made}", tmpfs)
            )

        yield make
