"""Several hosts on one Linux machine: network namespaces, each running its own OpenSSH sshd.

    root namespace (the orchestrator): bridge <p>mb, holding the management subnet's .1
      └─ veth <p>m<i> ── <p>mgmt in host i (namespace <p>-h<i>): SSH, agents, rank 0's API
    data network, one of:
      switch: host i's <p>data ── port <p>d<i> of bridge <p>db in namespace <p>-sw
      ring:   a veth pair per pair of neighbours (i, i+1 mod N): <p>c<j> in host i faces
              host j, each cable its own /30 (a cabled Thunderbolt ring of Macs)

<p> is a per-run prefix ("mco" + 4 hex digits). A run takes a /24 of 198.18.0.0/15 that no
route here overlaps: its lower /25 for management, its upper /25 for data; the root's address
on <p>mb routes the /24, so parallel runs skip it. Hosts have connected routes only (no default
route, no NAT). The data bridge has its own namespace: the root's firewall never sees it.
Faults apply to data links only, so SSH stays up; where the kernel lacks sch_netem, tbf
stands in for 100% loss (a bucket smaller than any packet) or a rate limit.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest

from testkit.sshd import SSHD, keygen, sshd_config, wait_listening

Topology = Literal["switch", "ring"]
IP, TC = "/usr/sbin/ip", "/usr/sbin/tc"
REQUIRE_ENV = "ORCHESTRATOR_TESTS_REQUIRE_NETNS"
BENCHMARK_NET = ipaddress.IPv4Network("198.18.0.0/15")
MAX_HOSTS = 30  # 32 cables fit the data /25 and host numbers keep names within 15 chars


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def _ip(ns: str | None, *args: str) -> list[str]:
    return [IP, "-n", ns, *args] if ns else [IP, *args]


@dataclass
class Host:
    index: int
    name: str  # "h0": its [[nodes]] name
    ns: str  # its network namespace
    mgmt_ip: str  # sshd listens here; the root namespace reaches it over the management bridge
    ssh_port: int = 22
    data_ip: str = ""  # where ranks reach it (ring: its address on the cable to host i-1)
    # Peer index -> this host's address as that peer reaches it (ring: neighbours only).
    data_ips: dict[int, str] = field(default_factory=dict)
    sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside this host's namespace, its output captured as text."""
        argv = [IP, "netns", "exec", self.ns, *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a command inside this host; teardown ends it with everything else here."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen([IP, "netns", "exec", self.ns, *argv], **kwargs)
        self.started.append(proc)
        return proc

    def pids(self) -> list[int]:
        return _netns_pids(self.ns)


@dataclass
class MultiHost:
    prefix: str
    topology: Topology
    hosts: list[Host]
    dir: Path
    user_key: Path  # the private key every host's sshd accepts
    known_hosts: Path  # every host's key at its management address, for strict checking
    mgmt_net: ipaddress.IPv4Network
    data_net: ipaddress.IPv4Network

    def cables(self) -> list[tuple[int, int]]:
        """The ring's cables as (i, i+1 mod N); two hosts share one cable."""
        if self.topology != "ring":
            return []
        size = len(self.hosts)
        return [(i, (i + 1) % size) for i in range(size if size > 2 else 1)]

    def node(self, i: int, **overrides: Any) -> dict[str, Any]:
        """Fields of a cluster.toml [[nodes]] table reaching host i over strict SSH."""
        host = self.hosts[i]
        return {
            "name": host.name,
            "transport": "ssh",
            "ssh": f"{getpass.getuser()}@{host.mgmt_ip}",
            "ssh_port": host.ssh_port,
            "identity_file": str(self.user_key),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,  # remote commands run on this same filesystem
            "ip": host.data_ip,
        } | overrides

    def links(self) -> list[dict[str, Any]]:
        """cluster.toml [[links]] tables: each cable's two hosts and their addresses on it."""
        h = self.hosts
        return [
            {"between": [h[i].name, h[j].name], "ips": [h[i].data_ips[j], h[j].data_ips[i]]}
            for i, j in self.cables()
        ]

    # Faults on a data link: in a ring (i, j) names the cable between hosts i and j, on a
    # switch i names host i's port. They apply at both ends, so both directions suffer.

    def link_down(self, i: int, j: int | None = None) -> None:
        for ns, dev in self.ends(i, j):
            sh(*_ip(ns, "link", "set", "dev", dev, "down"))

    def link_up(self, i: int, j: int | None = None) -> None:
        for ns, dev in self.ends(i, j):
            sh(*_ip(ns, "link", "set", "dev", dev, "up"))

    def netem(
        self, i: int, j: int | None = None, *, loss_percent: float | None = None,
        delay_ms: float | None = None, rate: str | None = "200mbit",
    ) -> None:
        """Loss, delay and a rate limit on the link (tbf where the kernel has no netem)."""
        try:
            self._qdisc(i, j, _qdisc_spec(True, loss_percent, delay_ms, rate))
        except RuntimeError as error:
            if "Specified qdisc kind is unknown" not in str(error):
                raise
            self._qdisc(i, j, _qdisc_spec(False, loss_percent, delay_ms, rate))

    def clear_netem(self, i: int, j: int | None = None) -> None:
        for ns, dev in self.ends(i, j):
            sh(TC, "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def drop_all(self, i: int, j: int | None = None) -> None:
        self.netem(i, j, loss_percent=100, rate=None)

    shape, clear = netem, clear_netem  # older names (tests/orchestrator, bench/)

    def _qdisc(self, i: int, j: int | None, spec: list[str]) -> None:
        for ns, dev in self.ends(i, j):
            sh(TC, "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec)

    def ends(self, i: int, j: int | None = None) -> list[tuple[str, str]]:
        """(namespace, interface) at both ends of a data link."""
        p = self.prefix
        if self.topology == "switch":
            if j is not None:
                raise ValueError("on a switch a data link is host i's port: name it by i")
            return [(self.hosts[i].ns, f"{p}data"), (f"{p}-sw", f"{p}d{i}")]
        if j is None or j not in self.hosts[i].data_ips:
            raise ValueError(f"hosts {i} and {j} share no cable in the ring")
        return [(self.hosts[i].ns, f"{p}c{j}"), (self.hosts[j].ns, f"{p}c{i}")]


def _qdisc_spec(netem: bool, loss: float | None, delay: float | None, rate: str | None) -> list[str]:
    if netem:
        return ["netem", *(["delay", f"{delay}ms"] if delay else []),
                *(["loss", f"{loss}%"] if loss else []), *(["rate", rate] if rate else [])]
    if loss == 100:  # a token bucket smaller than any frame: every packet, ARP too, dropped
        return ["tbf", "rate", "8bit", "burst", "10", "limit", "10"]
    if not loss and not delay and rate:
        return ["tbf", "rate", rate, "burst", "256kb", "latency", "200ms"]
    raise RuntimeError("this kernel has no sch_netem: tbf gives only 100% loss or a rate")


@contextlib.contextmanager
def multi_host(count: int, topology: Topology, tmp_dir: Path) -> Iterator[MultiHost]:
    """`count` hosts joined as `topology`, each with sshd; all removed on exit, come what may."""
    if not (1 if topology == "switch" else 2) <= count <= MAX_HOSTS:
        raise ValueError(f"{count} hosts: a {topology} takes 1 or 2 to {MAX_HOSTS}")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    lock_file = Path(tempfile.gettempdir()) / "mco-netns.lock"
    with contextlib.ExitStack() as stack:
        with lock_file.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel runs choose names and subnets in turn
            net = plan(*_free_names(), count, topology, tmp_dir)
            stack.callback(teardown, net)
            # With its address on the bridge our /24 is routed: other runs skip it now.
            _bridge(None, f"{net.prefix}mb", f"{net.mgmt_net[1]}/{net.mgmt_net.prefixlen}")
        _management(net)
        if topology == "switch":
            _switch(net)
        else:
            _ring(net)
        _start_sshds(net)
        yield net


def plan(
    prefix: str, block: ipaddress.IPv4Network, count: int, topology: Topology, tmp_dir: Path
) -> MultiHost:
    """Names and addresses, before anything exists (see the module docstring)."""
    mgmt_net, data_net = block.subnets(prefixlen_diff=1)
    hosts = [Host(i, f"h{i}", f"{prefix}-h{i}", str(mgmt_net[2 + i])) for i in range(count)]
    net = MultiHost(
        prefix, topology, hosts, tmp_dir, tmp_dir / "id_ed25519", tmp_dir / "known_hosts",
        mgmt_net, data_net,
    )
    if topology == "switch":
        for host in hosts:
            host.data_ip = str(data_net[1 + host.index])
            host.data_ips = {j: host.data_ip for j in range(count) if j != host.index}
        return net
    for k, (i, j) in enumerate(net.cables()):
        hosts[i].data_ips[j] = str(data_net[4 * k + 1])
        hosts[j].data_ips[i] = str(data_net[4 * k + 2])
    for host in hosts:
        host.data_ip = host.data_ips[(host.index - 1) % count]
    return net


def _free_names() -> tuple[str, ipaddress.IPv4Network]:
    """A prefix no link or namespace has, a random /24 of 198.18.0.0/15 no route overlaps."""
    taken = sh(IP, "-o", "link").stdout + sh(IP, "netns", "list").stdout
    while (prefix := "mco" + secrets.token_hex(2)) in taken:
        pass
    routes = sh(IP, "-4", "route", "show", "table", "all").stdout
    used = [
        ipaddress.IPv4Network(found, strict=False)
        for found in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b", routes)
    ]
    blocks = list(BENCHMARK_NET.subnets(new_prefix=24))
    random.shuffle(blocks)
    for block in blocks:
        if not any(block.overlaps(net) for net in used):
            return prefix, block
    raise RuntimeError("every /24 of 198.18.0.0/15 is routed already")


def _bridge(ns: str | None, name: str, address: str | None = None) -> None:
    sh(*_ip(ns, "link", "add", "name", name, "type", "bridge"))
    if address:
        sh(*_ip(ns, "addr", "add", address, "dev", name))
    sh(*_ip(ns, "link", "set", "dev", name, "up"))


def _veth(ns: str | None, port: str, bridge: str, host: Host, inside: str, cidr: str) -> None:
    """A veth from `bridge` (in namespace ns) into the host, whose end gets address cidr."""
    sh(*_ip(ns, "link", "add", "name", port, "type", "veth", "peer", "name", inside,
            "netns", host.ns))
    sh(*_ip(ns, "link", "set", "dev", port, "master", bridge, "up"))
    sh(*_ip(host.ns, "addr", "add", cidr, "dev", inside))
    sh(*_ip(host.ns, "link", "set", "dev", inside, "up"))


def _management(net: MultiHost) -> None:
    p, bits = net.prefix, net.mgmt_net.prefixlen
    for host in net.hosts:
        sh(IP, "netns", "add", host.ns)
        sh(*_ip(host.ns, "link", "set", "dev", "lo", "up"))
        _veth(None, f"{p}m{host.index}", f"{p}mb", host, f"{p}mgmt", f"{host.mgmt_ip}/{bits}")


def _switch(net: MultiHost) -> None:
    p, bits = net.prefix, net.data_net.prefixlen
    sh(IP, "netns", "add", f"{p}-sw")
    _bridge(f"{p}-sw", f"{p}db")
    for host in net.hosts:
        _veth(f"{p}-sw", f"{p}d{host.index}", f"{p}db", host, f"{p}data",
              f"{host.data_ip}/{bits}")


def _ring(net: MultiHost) -> None:
    """One veth pair per cable, made right in its two hosts, each end with its /30."""
    p = net.prefix
    for i, j in net.cables():
        a, b = net.hosts[i], net.hosts[j]
        sh(IP, "link", "add", "name", f"{p}c{j}", "netns", a.ns, "type", "veth",
           "peer", "name", f"{p}c{i}", "netns", b.ns)
        for host, peer in ((a, j), (b, i)):
            dev = f"{p}c{peer}"
            sh(*_ip(host.ns, "addr", "add", f"{host.data_ips[peer]}/30", "dev", dev))
            sh(*_ip(host.ns, "link", "set", "dev", dev, "up"))


def _start_sshds(net: MultiHost) -> None:
    """Every host's sshd, started together; known_hosts has each host key at its address."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    user_pub = keygen(net.user_key)
    lines = []
    for host in net.hosts:
        d = net.dir / host.name
        d.mkdir(exist_ok=True)
        alg, blob = keygen(d / "host_ed25519").split()[:2]
        where = host.mgmt_ip if host.ssh_port == 22 else f"[{host.mgmt_ip}]:{host.ssh_port}"
        lines.append(f"{where} {alg} {blob}\n")
        (d / "authorized_keys").write_text(user_pub + "\n")
        config = sshd_config(d, host.mgmt_ip, host.ssh_port)
        with (d / "sshd.log").open("wb") as log:
            argv = [str(SSHD), "-D", "-e", "-f", str(config)]
            host.sshd = host.popen(argv, stdout=log, stderr=subprocess.STDOUT)
    net.known_hosts.write_text("".join(lines))
    for host in net.hosts:
        assert host.sshd is not None
        wait_listening(host.sshd, host.mgmt_ip, host.ssh_port, net.dir / host.name / "sshd.log")


def teardown(net: MultiHost) -> None:
    """Remove what carries this run's prefix, never another run's: the processes in its
    namespaces, the namespaces (and the veth ends in them), its root-side links."""
    namespaces = [ns for ns in sh(IP, "netns", "list").stdout.split() if ns.startswith(net.prefix)]
    for ns in namespaces:
        _kill_namespace(ns)
    for proc in (proc for host in net.hosts for proc in host.started):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # reap our own children, dead by now
    # Root-side ends first: deleting one removes its peer at once, whereas a deleted
    # namespace's veths go away asynchronously.
    for name in own_links(net.prefix):
        sh(IP, "link", "del", "dev", name, check=False)
    for ns in namespaces:
        sh(IP, "netns", "del", ns, check=False)


def own_links(prefix: str) -> list[str]:
    """Names of the root namespace's links that start with prefix."""
    names = (line.split(":")[1].strip() for line in sh(IP, "-o", "link").stdout.splitlines())
    return [name.split("@")[0] for name in names if name.startswith(prefix)]


def _netns_pids(ns: str) -> list[int]:
    return [int(pid) for pid in sh(IP, "netns", "pids", ns, check=False).stdout.split()]


def _kill_namespace(ns: str) -> None:
    """Every process in the namespace (sshd, sessions, agents, ranks), by PID: TERM, then
    KILL to whatever is there after 3 s (listed again: something may have started more)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = []
        for pid in _netns_pids(ns):
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
                procs[-1].send_signal(sig)
        psutil.wait_procs(procs, timeout=3)


@cache
def unusable_reason() -> str | None:
    """Why hosts cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in (IP, TC, str(SSHD), "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install iproute2 openssh-server)"
    probe = f"mco{secrets.token_hex(2)}-probe"
    made = sh(IP, "netns", "add", probe, check=False)
    sh(IP, "netns", "del", probe, check=False)
    return None if made.returncode == 0 else f"ip netns add failed: {made.stderr.strip()}"


def require_netns() -> None:
    """Skip the calling test where hosts cannot be made; fail it when CI requires them."""
    reason = unusable_reason()
    if reason is not None and os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1")
    if reason is not None:
        pytest.skip(reason)


ClusterFactory = Callable[..., MultiHost]  # (count, topology="switch") -> a live cluster
HostsFactory = ClusterFactory  # its older name


@contextlib.contextmanager
def cluster_factory(tmp_path: Path) -> Iterator[ClusterFactory]:
    """Makes clusters under tmp_path; all are torn down when the block ends."""
    with contextlib.ExitStack() as stack:

        def make(count: int, topology: Topology = "switch") -> MultiHost:
            where = Path(tempfile.mkdtemp(prefix="hosts", dir=tmp_path))
            return stack.enter_context(multi_host(count, topology, where))

        yield make


@pytest.fixture
def netns_hosts(tmp_path: Path) -> Iterator[ClusterFactory]:
    """The older name of testkit.netns_fixture.netns_cluster. It stays here because
    tests/conftest.py imports it from here (netns_fixture importing back would be a cycle)."""
    require_netns()
    with cluster_factory(tmp_path) as make:
        yield make
