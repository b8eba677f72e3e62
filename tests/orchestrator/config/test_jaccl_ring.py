"""JACCL on a ring of cables: [[links]] with each end's RDMA device, validated as a ring,
launched with the device matrix and MLX_JACCL_RING that MLX's jaccl-ring mode reads."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import load_cluster
from orchestrator.config.jaccl_devices import node_devices
from orchestrator.config.links import cable_labels, hops
from orchestrator.launch.plan import build_plan
from testkit.config_files import errors_of, write

# Four Mac Studios, each cabled to its two ring neighbours (4 cables, not a 6-cable mesh).
# The LAN carries SSH and JACCL's TCP coordinator (rank 0's ip).
FOUR_IN_A_RING = """
[cluster]
backend = "jaccl"
[[nodes]]
name = "s1"
ip = "10.1.0.10"
[[nodes]]
name = "s2"
transport = "ssh"
ssh = "me@s2"
python = "/opt/py/bin/python"
ip = "10.1.0.11"
[[nodes]]
name = "s3"
transport = "ssh"
ssh = "me@s3"
python = "/opt/py/bin/python"
ip = "10.1.0.12"
[[nodes]]
name = "s4"
transport = "ssh"
ssh = "me@s4"
python = "/opt/py/bin/python"
ip = "10.1.0.13"
[[links]]
between = ["s1", "s2"]
rdma = ["rdma_en2", "rdma_en3"]
[[links]]
between = ["s2", "s3"]
rdma = ["rdma_en2", "rdma_en3"]
[[links]]
between = ["s3", "s4"]
rdma = ["rdma_en2", "rdma_en3"]
[[links]]
between = ["s4", "s1"]
rdma = ["rdma_en2", "rdma_en3"]
"""


def test_ring_plan_gives_neighbours_devices_and_null_elsewhere(tmp_path: Path) -> None:
    """Each rank's row names its devices towards rank i-1 and i+1 only, as
    `mlx.distributed_config --backend jaccl-ring` writes it; every rank gets MLX_JACCL_RING."""
    spec = load_cluster(write(tmp_path, FOUR_IN_A_RING))
    plan = build_plan(spec, "L1")
    matrix = json.loads(plan.ranks[0].files["ibv_devices.json"])
    assert matrix == [
        [None, "rdma_en2", None, "rdma_en3"],
        ["rdma_en3", None, "rdma_en2", None],
        [None, "rdma_en3", None, "rdma_en2"],
        ["rdma_en2", None, "rdma_en3", None],
    ]
    for rank in plan.ranks:
        assert rank.env["MLX_JACCL_RING"] == "1"
        assert rank.env["MLX_JACCL_COORDINATOR"] == "10.1.0.10:52100"
        assert rank.env["MLX_IBV_DEVICES"] == "ibv_devices.json"
        assert "MLX_METAL_FAST_SYNCH" not in rank.env
    # Every rank reaches the coordinator over the LAN, not over a cable.
    assert [(h.src, h.dst, h.address.ip) for h in hops(spec)] == [
        (1, 0, "10.1.0.10"),
        (2, 0, "10.1.0.10"),
        (3, 0, "10.1.0.10"),
    ]


def test_mesh_plan_keeps_the_nodes_rdma_lists_and_no_ring_flag(tmp_path: Path) -> None:
    """Without [[links]] jaccl is a mesh: the nodes' rdma lists, no MLX_JACCL_RING."""
    text = """
    [cluster]
    backend = "jaccl"
    [[nodes]]
    name = "a"
    ip = "10.0.0.1"
    rdma = ["", "rdma_en3"]
    [[nodes]]
    name = "b"
    ip = "10.0.0.2"
    rdma = ["rdma_en3", ""]
    """
    plan = build_plan(load_cluster(write(tmp_path, text)), "L1")
    assert json.loads(plan.ranks[1].files["ibv_devices.json"]) == [
        [None, "rdma_en3"],
        ["rdma_en3", None],
    ]
    assert "MLX_JACCL_RING" not in plan.ranks[1].env


def test_two_cables_per_neighbour_pair_are_lists(tmp_path: Path) -> None:
    """Several cables between two neighbours: a list per entry, in [[links]] order on both
    ends, so connection c on one side is the same cable as connection c on the other; two
    Macs on one cable are left to MLX's mesh (no MLX_JACCL_RING)."""
    text = """
    [cluster]
    backend = "jaccl"
    [[nodes]]
    name = "a"
    ip = "10.0.0.1"
    [[nodes]]
    name = "b"
    ip = "10.0.0.2"
    [[links]]
    between = ["a", "b"]
    rdma = ["rdma_en2", "rdma_en4"]
    [[links]]
    between = ["b", "a"]
    rdma = ["rdma_en5", "rdma_en3"]
    """
    plan = build_plan(load_cluster(write(tmp_path, text)), "L1")
    assert json.loads(plan.ranks[0].files["ibv_devices.json"]) == [
        [None, ["rdma_en2", "rdma_en3"]],
        [["rdma_en4", "rdma_en5"], None],
    ]
    assert plan.ranks[0].env["MLX_JACCL_RING"] == "1"  # MLX's mesh would use one cable
    flat = textwrap.dedent(text)
    one_cable = flat[: flat.index("[[links]]\nbetween = [\"b\", \"a\"]")]
    plan = build_plan(load_cluster(write(tmp_path, one_cable)), "L1")
    assert json.loads(plan.ranks[0].files["ibv_devices.json"]) == [
        [None, "rdma_en2"],
        ["rdma_en4", None],
    ]
    assert "MLX_JACCL_RING" not in plan.ranks[0].env  # the same matrix is a mesh


def test_node_devices_name_interface_and_peer(tmp_path: Path) -> None:
    """What preflight checks per node: each device, the interface behind it and its peer."""
    spec = load_cluster(write(tmp_path, FOUR_IN_A_RING))
    found = [(d.device, d.interface, d.peer, d.field) for d in node_devices(spec)["s1"]]
    assert found == [
        ("rdma_en2", "en2", "s2", "links[0].rdma[0]"),
        ("rdma_en3", "en3", "s4", "links[3].rdma[1]"),
    ]


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            FOUR_IN_A_RING.replace('between = ["s3", "s4"]', 'between = ["s1", "s3"]'),
            "links[2].between",
            "s1 and s3 are not neighbours",
        ),
        (
            FOUR_IN_A_RING.replace('rdma = ["rdma_en2", "rdma_en3"]\n[[links]]\nbetween = ["s4"', (
                'rdma = ["rdma_en2", "rdma_en3"]\n[[links]]\nbetween = ["s3", "s4"]\n'
                'rdma = ["rdma_en4", "rdma_en5"]\n[[links]]\nbetween = ["s4"'
            )),
            "links",
            "different numbers of cables",
        ),
        (FOUR_IN_A_RING.replace('rdma = ["rdma_en2", "rdma_en3"]\n', "", 1), "links[0].rdma",
         "missing: a jaccl ring names each end's RDMA device"),
        (
            FOUR_IN_A_RING.replace(
                'ip = "10.1.0.10"', 'ip = "10.1.0.10"\nrdma = ["", "x", "", "y"]'
            ),
            "nodes[0].rdma",
            "is set together with [[links]]",
        ),
        (
            FOUR_IN_A_RING.replace(
                'between = ["s4", "s1"]\nrdma = ["rdma_en2", "rdma_en3"]',
                'between = ["s4", "s1"]\nrdma = ["rdma_en2", "rdma_en2"]',
            ),
            "links[3].rdma[1]",
            "rdma_en2 on s1 is given for more than one cable",
        ),
        (FOUR_IN_A_RING.replace('ip = "10.1.0.10"\n', ""), "nodes[0].ip", "missing"),
        (
            FOUR_IN_A_RING.replace('backend = "jaccl"', 'backend = "ring"'),
            "links[0].rdma",
            "is only used by the jaccl backend",
        ),
    ],
    ids=[
        "not neighbours",
        "uneven cables",
        "no devices",
        "mesh and ring",
        "one port two cables",
        "no coordinator",
        "rdma on ring backend",
    ],
)
def test_broken_rings_name_the_field(tmp_path: Path, text: str, path: str, message: str) -> None:
    """Each ring mistake is an error at its field, with a fix."""
    issues = errors_of(tmp_path, text)
    matching = [issue for issue in issues if issue.path == path and message in issue.message]
    assert matching, [issue.render(Path("cluster.toml")) for issue in issues]
    assert all(issue.fix for issue in issues)


def test_linktest_names_each_ring_cable_by_its_devices(tmp_path: Path) -> None:
    """linktest's per-link rows (rank i -> i+1) name the cable: devices on jaccl."""
    spec = load_cluster(write(tmp_path, FOUR_IN_A_RING))
    assert cable_labels(spec) == {
        0: "rdma_en2 -> rdma_en3",
        1: "rdma_en2 -> rdma_en3",
        2: "rdma_en2 -> rdma_en3",
        3: "rdma_en2 -> rdma_en3",
    }
