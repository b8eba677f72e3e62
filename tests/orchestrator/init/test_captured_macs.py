"""`init` on Thunderbolt outputs captured from real Macs (tests/fixtures/README.md: an M5 Max
MacBook Pro cabled to an M3 Ultra Mac Studio over TB5, with a drive on another Studio
port; two M5 Max MacBook Pros on one cable, each with a dock, RDMA on one only)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from node_agent.probes.addresses import parse_ifconfig
from node_agent.probes.thunderbolt import is_thunderbolt5, parse_thunderbolt
from orchestrator.config.load import check_cluster_data
from orchestrator.init.addressing import bridge_steps, lan_address
from orchestrator.init.command import node_names
from orchestrator.init.layout import plan_layout
from orchestrator.init.probe import HostProbe
from orchestrator.init.render import Access, render
from testkit.paths import FIXTURES
from testkit.recorded_hosts import MACS, recorded_hosts

STUDIO_PAIR = "captured-macbook-studio-tb5"
LAPTOP_PAIR = "captured-macbook-pair-tb5"
MACBOOK_UUID = "817DCFA4-B481-4100-80FC-91C7AA969F0B"
STUDIO_UUID = "28CA4C30-A263-4C55-B302-953416D0B209"


def captured(scenario: str, host: str) -> str:
    return (MACS / scenario / host / "thunderbolt.txt").read_text()


def test_each_end_of_the_captured_cable_names_the_other() -> None:
    """The MacBook's bus 0 (receptacle 1) and the Studio's bus 1 (receptacle 2) carry each
    other's domain UUID; the cable runs at 80 Gb/s, which is Thunderbolt 5."""
    macbook = {p.receptacle: p for p in parse_thunderbolt(captured(STUDIO_PAIR, "macbook"))}
    studio = {p.receptacle: p for p in parse_thunderbolt(captured(STUDIO_PAIR, "studio"))}
    assert sorted(macbook) == ["1", "2", "3"] and sorted(studio) == list("123456")
    assert (macbook["1"].uuid, macbook["1"].connected_to) == (MACBOOK_UUID, STUDIO_UUID)
    assert (studio["2"].uuid, studio["2"].connected_to) == (STUDIO_UUID, MACBOOK_UUID)
    assert [p for p in macbook.values() if p.connected_to] == [macbook["1"]]
    assert studio["2"].peer_name == "MacBook Pro"  # its `_name`, not the model id Mac17,7
    assert is_thunderbolt5(macbook["1"].speed) and macbook["1"].speed == "80 Gb/s"


def test_a_drive_on_a_port_is_no_cable_to_a_mac() -> None:
    """The Studio's OWC Envoy Ultra (an item without a domain UUID, where mlx's
    distributed_config would fail) is that port's device, not a peer."""
    studio = {p.receptacle: p for p in parse_thunderbolt(captured(STUDIO_PAIR, "studio"))}
    assert studio["4"].connected_to is None and studio["4"].device == "Envoy Ultra"
    assert [p.receptacle for p in studio.values() if p.connected_to] == ["2"]


def init(scenario: str, targets: dict[str, str]) -> tuple[dict[str, Any], str]:
    """The file init writes for these captured hosts (it validates) and its text."""
    hosts = recorded_hosts(scenario, targets)
    names = node_names(list(targets.values()))
    text = render(hosts, names, plan_layout(hosts, names), Access(), "c", None)
    data = tomllib.loads(text)
    check_cluster_data(data, Path("cluster.toml"))
    return data, text


def test_init_on_the_captured_macbook_and_studio_writes_their_one_jaccl_link() -> None:
    """One link on the captured cable, each end's interface from networksetup (MacBook
    Thunderbolt 1 = en1, Studio Thunderbolt 2 = en3), rdma on both; the drive is shown as
    what it is."""
    data, text = init(STUDIO_PAIR, {"macbook": "me@macbook.local", "studio": "me@studio.local"})
    assert data["cluster"]["backend"] == "jaccl"
    assert [(k["between"], k["rdma"]) for k in data["links"]] == [
        (["macbook", "studio"], ["rdma_en1", "rdma_en3"])]
    assert "1 (en1) -> studio port 2, 80 Gb/s" in text
    assert "4 (en5) -> Envoy Ultra (not a Mac), 80 Gb/s" in text


def test_init_on_the_captured_macbook_pair_uses_the_port_macos_names_en6() -> None:
    """Captured networksetup: Thunderbolt 2 is en6 (not en2, the order-based guess): the
    cable is en6 to en6, with its /30 proposed on the service for 'Thunderbolt 2'; RDMA is
    off on one MacBook, so the ring backend, naming it; the docks are no cables."""
    data, text = init(LAPTOP_PAIR, {"local": "me@mbp-a.local", "peer": "me@mbp-b.local"})
    assert data["cluster"]["backend"] == "ring"
    assert [(k["between"], k["ips"]) for k in data["links"]] == [
        (["mbp-a", "mbp-b"], ["10.10.1.1", "10.10.1.2"])]
    assert "mbp-a en6 <-> mbp-b en6, 80 Gb/s" in text
    assert "-createnetworkservice 'TB en6 to mbp-b' 'Thunderbolt 2'" in text
    assert "me@mbp-a.local: rdma_ctl status is disabled" in text
    assert "3 (en2) -> SB-XTM5 (not a Mac), 80 Gb/s" in text
    assert "3 (en2) -> TBU405Pro (not a Mac), 40 Gb/s" in text


def test_a_captured_ifconfig_gives_the_lan_address_and_the_bridged_ports() -> None:
    """A real ifconfig (Thunderbolt en1-en3 in bridge0, Wi-Fi en0 and a USB Ethernet en7 on
    one LAN): en0 is the LAN address (as mlx picks it), a cable on en2 is taken out of the
    bridge first, and the bridge itself is no address."""
    text = (FIXTURES / "node_tools" / "ifconfig_macos_thunderbolt_bridge.txt").read_text()
    host = HostProbe("me@mac.local", system="Darwin", interfaces=parse_ifconfig(text))
    assert lan_address(host, {"en2"}) == "192.168.1.237"
    assert [str(s) for s in bridge_steps(host, {"en2"})] == [
        "sudo ifconfig bridge0 deletem en2   # for good: System Settings > Network > "
        "Thunderbolt Bridge > Manage Virtual Interfaces"]
    bridge = next(i for i in host.interfaces if i.name == "bridge0")
    assert bridge.members == ["en1", "en2", "en3"] and bridge.ipv4 == []
