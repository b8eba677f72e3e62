"""The multi-host harness itself: hosts reachable over SSH, data links as wired, faults, cleanup."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from testkit import require
from testkit.netns import IP, HostsFactory, MultiHost, multi_host, usable
from testkit.require import missing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A TCP connect from inside a host, as the ranks make them; prints ok or the error.
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close(); print('ok')\n"
    "except OSError as e:\n"
    "    print('refused' if isinstance(e, ConnectionRefusedError) else f'error {e}')\n"
)


def reach(net: MultiHost, src: int, address: str) -> str:
    """ok (something listens: sshd on 22), refused (answered), or the error, from host src."""
    return net.hosts[src].run([sys.executable, "-c", CONNECT, address, "22"]).stdout.strip()


async def ssh_run(net: MultiHost, i: int, command: str) -> str:
    host = net.hosts[i]
    async with asyncssh.connect(
        host.mgmt_ip, 22, username="root", client_keys=[str(net.user_key)],
        known_hosts=str(net.known_hosts),
    ) as conn:
        return str((await conn.run(command, check=True)).stdout)


async def test_switch_hosts_answer_ssh_and_own_their_data_address(
    netns_hosts: HostsFactory,
) -> None:
    """Three hosts: SSH with strict host keys to each; each owns its data address; all meet."""
    net = netns_hosts(3, "switch")
    for i in range(3):
        addresses = await ssh_run(net, i, "ip -o -4 addr show")
        assert net.data_ip(i) in addresses and net.hosts[i].mgmt_ip in addresses
    assert [reach(net, 0, net.data_ip(j)) for j in (1, 2)] == ["refused", "refused"]


def test_ring_neighbours_share_only_their_cable(netns_hosts: HostsFactory) -> None:
    """Each cable is its own /30: neighbours reach each other on it, nothing else is shared."""
    net = netns_hosts(3, "ring")
    for i in range(3):
        j = (i + 1) % 3
        assert reach(net, i, net.hosts[j].data_ips[i]) == "refused"
        assert reach(net, j, net.hosts[i].data_ips[j]) == "refused"
    # Host 0 has no address in the cable between hosts 1 and 2: no route there.
    assert "unreachable" in reach(net, 0, net.hosts[1].data_ips[2]).lower()
    assert [link["between"] for link in net.links()] == [["h0", "h1"], ["h1", "h2"], ["h2", "h0"]]


def test_loss_on_one_cable_cuts_only_that_cable(netns_hosts: HostsFactory) -> None:
    """100% loss on the cable 0-1: 0 cannot reach 1 on it, 0-2 still works; cleared: back."""
    net = netns_hosts(3, "ring")
    net.drop_all(0, 1)
    assert "timed out" in reach(net, 0, net.hosts[1].data_ips[0])
    assert reach(net, 0, net.hosts[2].data_ips[0]) == "refused"
    net.clear(0, 1)
    assert answers_again(net, 0, net.hosts[1].data_ips[0])
    net.link_down(0, 1)
    assert reach(net, 0, net.hosts[1].data_ips[0]) != "refused"
    net.link_up(0, 1)
    assert answers_again(net, 0, net.hosts[1].data_ips[0])


def answers_again(net: MultiHost, src: int, address: str, within_s: float = 15.0) -> bool:
    """After a fault the neighbour entry may say 'no route' for a few seconds (ARP failed
    while packets were dropped), as on a real cable: poll."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if reach(net, src, address) == "refused":
            return True
        time.sleep(0.5)
    return False


def test_teardown_leaves_nothing_even_on_failure(tmp_path: Path) -> None:
    """After the block (here: raising), no namespace, link, route or sshd of the run is left."""
    if (reason := usable()) is not None:
        missing(reason, require.NETNS)
    with pytest.raises(RuntimeError), multi_host(2, "ring", tmp_path) as net:
        pids = [host.sshd.pid for host in net.hosts if host.sshd]
        raise RuntimeError("the test failed")
    listing = subprocess.run([IP, "-o", "link"], capture_output=True, text=True).stdout
    namespaces = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
    routes = subprocess.run([IP, "route"], capture_output=True, text=True).stdout
    assert net.prefix not in listing and net.prefix not in namespaces
    assert str(net.data_net.network_address) not in routes
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
