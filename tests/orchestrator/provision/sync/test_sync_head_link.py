"""The head on the ring pushes over its cable: a node cabled to a `local` node fetches the
model from the head's end of that cable (TLS), not over its SSH address; a node that
cannot connect back is sent the model by SFTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testkit.netns import IP, HostsFactory, PrivateTmpfs, sh
from testkit.orchestrator_process import write_cluster
from testkit.sync_runs import by_node, place_model, same_model, sync

pytestmark = pytest.mark.timeout(300)


def counter(dev: str, which: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/{which}").read_text())


@pytest.mark.e2e
def test_the_heads_push_goes_over_its_cable_to_the_node(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """h0 is cabled to this machine (a veth standing for a Thunderbolt cable): the model's
    bytes leave through the cable (its kernel counter), not over h0's SSH address."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(1, "switch", PrivateTmpfs(str(mount), "128m"))
    cable = f"{net.prefix}t"
    base = net.data_net.network_address + 248  # a /30 of its own, outside the hosts' switch
    head_ip, node_ip = str(base + 1), str(base + 2)
    sh(IP, "link", "add", cable, "type", "veth", "peer", "name", "thead", "netns", net.hosts[0].ns)
    try:
        sh(IP, "addr", "add", f"{head_ip}/30", "dev", cable)
        sh(IP, "link", "set", cable, "up")
        sh(IP, "-n", net.hosts[0].ns, "addr", "add", f"{node_ip}/30", "dev", "thead")
        sh(IP, "-n", net.hosts[0].ns, "link", "set", "thead", "up")
        head = {"name": "head", "transport": "local", "ip": head_ip, "python": sys.executable}
        nodes = [head, net.node(0, ip=node_ip)]
        config = write_cluster(tmp_path, str(model), nodes)
        config.write_text(
            config.read_text()
            + f'\n[[links]]\nbetween = ["{net.hosts[0].name}", "head"]\n'
            + f'ips = ["{node_ip}", "{head_ip}"]\n'
        )
        size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
        over_cable = counter(cable, "tx_bytes")
        code, report = sync(config)
        over_cable = counter(cable, "tx_bytes") - over_cable
        node = by_node(report)[net.hosts[0].name]
        assert code == 0 and node["status"] == "synced", report
        assert node["via"] == f"tls {head_ip}", node
        assert size <= over_cable <= size * 1.05, (over_cable, size)
        assert same_model(net, 0, model, tiny_model_dir)
    finally:
        sh(IP, "link", "del", cable, check=False)


@pytest.mark.e2e
def test_a_node_that_cannot_connect_back_is_pushed_by_sftp(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The cable's far end is down (no route from h0 to our end): h0's fetch cannot connect,
    the head pushes by SFTP instead, says why, and the copy verifies."""
    mount, model = place_model(tmp_path, tiny_model_dir)
    net = netns_hosts(1, "switch", PrivateTmpfs(str(mount), "128m"))
    cable = f"{net.prefix}t"
    base = net.data_net.network_address + 248
    head_ip, node_ip = str(base + 1), str(base + 2)
    sh(IP, "link", "add", cable, "type", "veth", "peer", "name", "thead", "netns", net.hosts[0].ns)
    try:
        sh(IP, "addr", "add", f"{head_ip}/30", "dev", cable)
        sh(IP, "link", "set", cable, "up")  # h0's end: no address, down
        head = {"name": "head", "transport": "local", "ip": head_ip, "python": sys.executable}
        config = write_cluster(tmp_path, str(model), [head, net.node(0, ip=node_ip)])
        config.write_text(
            config.read_text()
            + f'\n[[links]]\nbetween = ["{net.hosts[0].name}", "head"]\n'
            + f'ips = ["{node_ip}", "{head_ip}"]\n'
        )
        code, report = sync(config)
        node = by_node(report)[net.hosts[0].name]
        assert code == 0 and node["status"] == "synced", report
        assert node["via"] == "sftp", node
        assert f"cannot reach the head at {head_ip}" in node["head_error"], node
        assert same_model(net, 0, model, tiny_model_dir)
    finally:
        sh(IP, "link", "del", cable, check=False)
