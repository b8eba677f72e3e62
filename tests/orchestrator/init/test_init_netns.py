"""`orchestrator init` on namespace hosts with their own sshd: a switch, a cabled ring, and
a ring cabled but not addressed (`--apply`)."""

from __future__ import annotations

import getpass
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from testkit.netns import IP, HostsFactory, MultiHost
from testkit.nine_heads import write_nine_heads_model
from testkit.orchestrator_process import gateway_status, run_cli, running
from testkit.ports import cluster_ports

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def init(net: MultiHost, output: Path, *options: str) -> dict[str, Any]:
    """`orchestrator init` of every host over SSH, as the docs say to run it."""
    targets = [f"{getpass.getuser()}@{host.mgmt_ip}" for host in net.hosts]
    done = run_cli("init", *targets, "-o", str(output), "--identity-file", str(net.user_key),
                   "--known-hosts", str(net.known_hosts), "--python", sys.executable, *options)
    assert done.returncode == 0, done.stderr
    assert run_cli("validate", str(output)).returncode == 0
    return tomllib.loads(output.read_text())


def test_init_on_a_switch_gives_each_node_its_data_address(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """3 hosts on one data subnet (SSH on another): ring backend, each node's ip its
    address on the data network (not the SSH one), no links, memory_gb from the host."""
    net = netns_hosts(3, "switch")
    data = init(net, tmp_path / "cluster.toml")
    assert data["cluster"]["backend"] == "ring"
    assert "links" not in data
    assert [n["ip"] for n in data["nodes"]] == [net.data_ip(i) for i in range(3)]
    assert [n["ssh"].rpartition("@")[2] for n in data["nodes"]] == [h.mgmt_ip for h in net.hosts]
    assert all(0 < n["memory_gb"] < 1024 for n in data["nodes"])


def serving(config: Path, tmp_path: Path) -> str:
    """Free ports, a state dir of the test's own, no standby ranks, and the tiny model with
    the bundled model's head counts (the point is init's file, not the weights): the file
    init wrote, otherwise as it is. Returns the served model's id."""
    data = tomllib.loads(config.read_text())
    model = write_nine_heads_model(tmp_path / "nine-heads", num_layers=3)
    data["model"]["path"] = str(model)
    rank_port, api_port, rank_api_port = cluster_ports(len(data["nodes"]))
    data["cluster"].update(name="test", state_dir=str(tmp_path / "state"), rank_port=rank_port)
    data["api"] = {"host": "127.0.0.1", "port": api_port}
    data["serving"] = {"rank_api_port": rank_api_port, "keepalive_s": 1.0}
    data["supervisor"] = {"standby_ranks": False, "stop_grace_s": 3.0}
    config.write_text(tomli_w.dumps(data))
    return model.name


def test_init_on_a_cabled_ring_finds_the_cables_and_serves(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """3 hosts joined by 3 point-to-point /30s: init writes one [[links]] per cable with
    both ends' addresses (the ring the test network built), and the file serves."""
    net = netns_hosts(3, "ring")
    config = tmp_path / "cluster.toml"
    data = init(net, config)
    assert data["cluster"]["backend"] == "ring"
    names = [n["name"] for n in data["nodes"]]
    found = {frozenset(zip(link["between"], link["ips"], strict=True)) for link in data["links"]}
    # The test network's own cables, its host h<i> being the i-th host given to init.
    built = {frozenset(zip([names[int(h[1:])] for h in link["between"]], link["ips"],
                           strict=True)) for link in net.links()}
    assert found == built
    served = serving(config, tmp_path)
    url = f"http://127.0.0.1:{tomllib.loads(config.read_text())['api']['port']}"
    with running(config, url=url) as orchestrator:
        reply = httpx.post(f"{url}/v1/completions", timeout=300, json={
            "model": served, "prompt": "The capital of France is",
            "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"].strip()
        assert [r["state"] for r in gateway_status(url)["ranks"]] == ["running"] * 3
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
    assert net.only_sshd_left()


def interfaces(net: MultiHost) -> list[list[tuple[Any, ...]]]:
    """Each host's interfaces: name, whether set up (not the carrier, which settles on its
    own) and IPv4 addresses: what --apply changes."""
    found = []
    for host in net.hosts:
        links = json.loads(host.run([IP, "-j", "addr", "show"]).stdout)
        found.append(sorted(
            (link["ifname"], "UP" in link["flags"], sorted(
                f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                if a["family"] == "inet"))
            for link in links))
    return found


# Sends a UDP datagram to argv[1] and waits: the far end's kernel answers "port unreachable"
# (ConnectionRefusedError) only if IPv4 reaches it over the cable.
REACHES = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect((sys.argv[1], 9))
s.send(b"x")
try:
    s.recv(1)
except ConnectionRefusedError:
    print("reached")
"""


def reaches(net: MultiHost, host: int, address: str) -> bool:
    done = net.hosts[host].run([sys.executable, "-c", REACHES, address])
    return done.stdout.strip() == "reached"


def test_init_apply_addresses_a_bare_ring_and_without_it_changes_nothing(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """3 hosts cabled in a ring with no IPv4 on the cables: init finds the cables from
    their link-local neighbours and proposes a /30 each, changing nothing; with --apply
    the /30s are set, the file written after a second probe validates with them, and each
    cable carries IPv4 from end to end."""
    net = netns_hosts(3, "bare-ring")
    before = interfaces(net)
    proposed = init(net, tmp_path / "proposed.toml")
    assert interfaces(net) == before
    assert "# proposed: give the ports these addresses" in (tmp_path / "proposed.toml").read_text()
    applied = init(net, tmp_path / "cluster.toml", "--apply")
    assert "proposed" not in (tmp_path / "cluster.toml").read_text()
    assert applied["links"] == proposed["links"]
    assert [tuple(link["between"]) for link in applied["links"]] == [
        ("node1", "node2"), ("node2", "node3"), ("node3", "node1")]
    for link in applied["links"]:
        a, b = (int(name.removeprefix("node")) - 1 for name in link["between"])
        assert reaches(net, a, link["ips"][1]) and reaches(net, b, link["ips"][0])
    assert interfaces(net) != before
