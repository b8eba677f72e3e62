"""`init` on recorded outputs of real Macs (reconstructed: tests/fixtures/README.md):
2 and 3 Macs, Thunderbolt 4 and 5, RDMA on and off -> the links, rdma and backend."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from orchestrator.config.load import check_cluster_data
from orchestrator.init.command import node_names
from orchestrator.init.layout import plan_layout
from orchestrator.init.render import Access, render
from testkit.recorded_hosts import recorded_hosts

STUDIOS = {"studio-a": "me@studio-a.local", "studio-b": "me@studio-b.local",
           "studio-c": "me@studio-c.local"}


NO_OPTIONS = Access()


def init(scenario: str, targets: dict[str, str], access: Access = NO_OPTIONS) -> tuple[
        dict[str, Any], str, dict[int, list[str]]]:
    """The file init writes for these recorded hosts (validated), its text, its commands."""
    hosts = recorded_hosts(scenario, targets)
    names = node_names(list(targets.values()))
    layout = plan_layout(hosts, names)
    text = render(hosts, names, layout, access, "c", None)
    data = tomllib.loads(text)
    check_cluster_data(data, Path("cluster.toml"))  # raises ConfigErrors if it does not validate
    return data, text, layout.commands


def links(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(tuple(k["between"]), tuple(k["ips"]), tuple(k.get("rdma") or ()))
            for k in data.get("links", [])]


def test_two_studios_on_tb5_with_rdma_get_jaccl_and_proposed_addresses() -> None:
    """One TB5 cable in the Thunderbolt Bridge, no addresses, RDMA on both: jaccl, the
    cable's devices, a proposed /30 with its networksetup commands, LAN ips, memory_gb."""
    data, text, commands = init("studio-pair-tb5-rdma",
                                {k: STUDIOS[k] for k in ("studio-a", "studio-b")})
    assert data["cluster"]["backend"] == "jaccl"
    assert links(data) == [(("studio-a", "studio-b"), ("10.10.1.1", "10.10.1.2"),
                            ("rdma_en2", "rdma_en3"))]
    assert [(n["name"], n["ip"], n["memory_gb"]) for n in data["nodes"]] == [
        ("studio-a", "10.1.0.10", 208), ("studio-b", "10.1.0.11", 208)]
    assert commands[0] == [
        "sudo ifconfig bridge0 deletem en2   # for good: System Settings > Network > "
        "Thunderbolt Bridge > Manage Virtual Interfaces",
        "sudo networksetup -createnetworkservice 'TB en2 to studio-b' 'Thunderbolt 1'   "
        "# skip if the port has a service",
        "sudo networksetup -setmanual 'TB en2 to studio-b' 10.10.1.1 255.255.255.252 ''",
    ]
    assert "-setmanual 'TB en3 to studio-a' 10.10.1.2 255.255.255.252" in commands[1][2]
    assert "Apple M3 Ultra, 256 GiB, macOS 26.2, Python 3.12.10, mlx 0.32.4" in text
    assert "RDMA: enabled; devices: rdma_en2 (active), rdma_en3, rdma_en4, rdma_en5" in text
    assert "ports: 1 (en2) -> studio-b port 2, Up to 80 Gb/s; 2 (en3) -> nothing" in text


def test_three_studios_in_a_tb5_ring_get_a_jaccl_ring_on_their_addresses() -> None:
    """A TB5 ring whose cables have their /30s: jaccl with one link per cable in ring
    order, each end's device and existing address; nothing to run."""
    data, _, commands = init("studio-trio-tb5-ring-rdma", STUDIOS)
    assert data["cluster"]["backend"] == "jaccl"
    assert links(data) == [
        (("studio-a", "studio-b"), ("10.10.1.1", "10.10.1.2"), ("rdma_en2", "rdma_en3")),
        (("studio-b", "studio-c"), ("10.10.2.1", "10.10.2.2"), ("rdma_en2", "rdma_en3")),
        (("studio-c", "studio-a"), ("10.10.3.2", "10.10.3.1"), ("rdma_en2", "rdma_en3")),
    ]
    assert commands == {}


def test_the_ring_follows_the_cables_not_the_order_given() -> None:
    """Hosts given c, a, b: rank 0 stays the first given, the links still pair the
    cabled ends (every pair is cabled in a ring of three)."""
    order = {k: STUDIOS[k] for k in ("studio-c", "studio-a", "studio-b")}
    data, _, _ = init("studio-trio-tb5-ring-rdma", order)
    assert [n["name"] for n in data["nodes"]] == ["studio-c", "studio-a", "studio-b"]
    assert sorted(tuple(sorted(k["between"])) for k in data["links"]) == [
        ("studio-a", "studio-b"), ("studio-a", "studio-c"), ("studio-b", "studio-c")]


def test_three_minis_on_tb4_get_the_tcp_ring_and_say_why_not_jaccl() -> None:
    """TB4 cables on macOS 15 (no rdma_ctl): ring backend over the cables' addresses,
    the comment naming the cable speed and the macOS version; no rdma anywhere."""
    minis = {f"mini-{k}": f"me@mini-{k}.local" for k in (1, 2, 3)}
    data, text, _ = init("mini-trio-tb4-ring", minis)
    assert data["cluster"]["backend"] == "ring"
    assert links(data) == [
        (("mini-1", "mini-2"), ("10.0.1.1", "10.0.1.2"), ()),
        (("mini-2", "mini-3"), ("10.0.2.1", "10.0.2.2"), ()),
        (("mini-3", "mini-1"), ("10.0.3.1", "10.0.3.2"), ()),
    ]
    assert "is Up to 40 Gb/s: RDMA needs Thunderbolt 5" in text
    assert "me@mini-1.local: macOS 15.5; RDMA needs 26.2 or later" in text
    assert all("ip" not in n for n in data["nodes"])


def test_rdma_off_on_one_mac_gives_the_ring_backend_and_names_it() -> None:
    """MacBook Pro + Mac mini on TB5, RDMA disabled on the mini: ring over a proposed /30,
    the reason names the mini; memory_gb from the laptop's raised GPU limit and the
    mini's share of RAM (its Python has no mlx to ask)."""
    data, text, commands = init("laptop-mini-tb5-rdma-off",
                                {"macbook": "me@macbook.local", "mini": "me@mini.local"})
    assert data["cluster"]["backend"] == "ring"
    assert links(data) == [(("macbook", "mini"), ("10.10.1.1", "10.10.1.2"), ())]
    assert "me@mini.local: rdma_ctl status is disabled" in text
    assert [n["memory_gb"] for n in data["nodes"]] == [110, 48]
    assert sorted(commands) == [0, 1]
    assert data["bootstrap"]["venv"] == "~/.venvs/mlx-cluster"


def test_access_options_are_written_on_every_ssh_node() -> None:
    """--identity-file, --known-hosts and --python go on each ssh node (no bootstrap venv)."""
    access = Access("~/.ssh/id_cluster", "~/.ssh/known_hosts_cluster", "~/venvs/mlx/bin/python")
    data, _, _ = init("studio-pair-tb5-rdma", {k: STUDIOS[k] for k in ("studio-a", "studio-b")},
                      access)
    assert "bootstrap" not in data
    for node in data["nodes"]:
        assert (node["identity_file"], node["known_hosts"], node["python"]) == (
            "~/.ssh/id_cluster", "~/.ssh/known_hosts_cluster", "~/venvs/mlx/bin/python")


def test_node_names_come_from_the_hosts() -> None:
    """Host names lose user and domain; an address becomes node<N>; duplicates differ."""
    assert node_names(["me@studio-a.local", "10.1.0.11", "studio-a.lan", "me@[::1]"]) == [
        "studio-a", "node2", "studio-a-2", "node4"]


QUAD = {f"studio-{k}": f"me@studio-{k}.local" for k in "abcd"}


def test_four_studios_in_a_full_tb5_mesh_get_a_jaccl_mesh() -> None:
    """6 TB5 cables, one per pair, RDMA on all four: jaccl with each node's device towards
    every rank (no [[links]]: a mesh), LAN ips, and a /30 proposed for every cable."""
    data, text, commands = init("studio-quad-tb5-mesh-rdma", QUAD)
    assert data["cluster"]["backend"] == "jaccl" and "links" not in data
    assert [n["rdma"] for n in data["nodes"]] == [  # the file's "" is None once loaded
        [None, "rdma_en2", "rdma_en3", "rdma_en4"], ["rdma_en2", None, "rdma_en3", "rdma_en4"],
        ["rdma_en2", "rdma_en3", None, "rdma_en4"], ["rdma_en2", "rdma_en3", "rdma_en4", None]]
    assert [n["ip"] for n in data["nodes"]] == ["10.1.0.10", "10.1.0.11", "10.1.0.12",
                                                 "10.1.0.13"]
    assert "a full mesh (6 cables, one per pair of Macs)" in text
    assert "not used" not in text
    setmanual = [c for host in commands.values() for c in host if "-setmanual" in c]
    assert len(setmanual) == 12  # both ends of 6 cables
    assert "#   studio-c en4 10.10.6.1/30 <-> studio-d en4 10.10.6.2/30" in text


def test_four_studios_in_a_ring_get_a_jaccl_ring_and_the_reason_it_is_no_mesh() -> None:
    """4 cables in a ring (4 of 6 pairs), RDMA on: JACCL's ring mode over [[links]], the
    comment saying it is no mesh and that tensor all-reduces go round in steps (pipeline
    or cabling every pair the way out)."""
    data, text, commands = init("studio-quad-tb5-ring-rdma", QUAD)
    assert data["cluster"]["backend"] == "jaccl"
    assert [tuple(k["between"]) for k in data["links"]] == [
        ("studio-a", "studio-b"), ("studio-b", "studio-c"), ("studio-c", "studio-d"),
        ("studio-d", "studio-a")]
    assert all(k["rdma"] == ["rdma_en2", "rdma_en3"] for k in data["links"])
    assert all("rdma" not in n for n in data["nodes"])
    flat = " ".join(line.lstrip("# ").strip() for line in text.splitlines())
    assert "not a full mesh (4 of the 6 pairs of Macs cabled)" in flat
    assert 'parallel = "pipeline"' in flat
    assert commands == {}


def test_the_file_suggests_instances_and_the_example_validates() -> None:
    """A commented [[instances]] example points to configuration.md; uncommented, it is a
    valid file too."""
    data, text, _ = init("studio-pair-tb5-rdma", {k: STUDIOS[k] for k in ("studio-a",
                                                                            "studio-b")})
    assert "instances" not in data and '"[[instances]]"' in text
    start = text.index("# [[instances]]")
    example = "\n".join(line.removeprefix("# ") for line in text[start:].splitlines())
    uncommented = tomllib.loads(text[:start] + example)
    check_cluster_data(uncommented, Path("cluster.toml"))
    assert uncommented["instances"][0]["nodes"] == ["studio-a", "studio-b"]


def test_an_ssh_port_given_with_the_host_is_the_nodes_ssh_port() -> None:
    """me@studio-b.local:2222 probed: ssh_port = 2222 on that node only, the file valid."""
    hosts = recorded_hosts("studio-pair-tb5-rdma", {k: STUDIOS[k] for k in ("studio-a",
                                                                              "studio-b")})
    hosts[1].ssh_port = 2222
    names = ["studio-a", "studio-b"]
    text = render(hosts, names, plan_layout(hosts, names), NO_OPTIONS, "c", None)
    data = tomllib.loads(text)
    check_cluster_data(data, Path("cluster.toml"))
    assert ["ssh_port" in n for n in data["nodes"]] == [False, True]
    assert data["nodes"][1]["ssh_port"] == 2222 and data["nodes"][1]["ssh"] == STUDIOS["studio-b"]


def test_a_cable_whose_rdma_port_is_down_gets_the_ring_backend_and_names_it() -> None:
    """ibv_devinfo shows studio-b's rdma_en3 (the cable's end) with no active port: jaccl
    would fail at preflight, so init writes ring and says which device, and why."""
    targets = {k: STUDIOS[k] for k in ("studio-a", "studio-b")}
    hosts = recorded_hosts("studio-pair-tb5-rdma", targets)
    assert hosts[1].rdma_down == ["rdma_en2", "rdma_en4", "rdma_en5"]  # as recorded
    hosts[1].rdma_down.append("rdma_en3")
    layout = plan_layout(hosts, node_names(list(targets.values())))
    assert layout.backend == "ring" and layout.links[0].rdma is None
    assert any("me@studio-b.local: rdma_en3 has no active port" in r for r in layout.reasons)
