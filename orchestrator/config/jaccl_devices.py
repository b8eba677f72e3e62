"""JACCL's device file (MLX_IBV_DEVICES) from cluster.toml: a full mesh or a ring of cables.

MLX reads an N x N matrix (mlx/distributed/jaccl/lib/jaccl/jaccl.cpp): entry [i][j] is
null, a device name or a list of names, rank i's device(s) towards rank j. A mesh (the
nodes' `rdma` lists) names a device for every pair. A ring ([[links]] with `rdma`) names
devices only towards rank i-1 and i+1, as many on each side (several cables between two
neighbours are a list), which is what `mlx.distributed_config --backend jaccl-ring` writes;
MLX_JACCL_RING then makes MLX pick the ring even where the matrix is also a mesh (3 nodes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.config.issues import ConfigIssue
from orchestrator.config.spec import ClusterSpec

Entry = str | list[str] | None


@dataclass(frozen=True)
class NodeDevice:
    """An RDMA device a node's rank opens, and the node at the other end of its cable."""

    device: str
    peer: str
    field: str  # where cluster.toml names it: "nodes[0].rdma[1]", "links[2].rdma[0]"

    @property
    def interface(self) -> str:
        """The network interface behind it: MLX names devices rdma_<interface>."""
        return self.device.removeprefix("rdma_")


def is_jaccl_ring(spec: ClusterSpec) -> bool:
    return spec.cluster.backend == "jaccl" and bool(spec.links)


def wants_ring_flag(spec: ClusterSpec) -> bool:
    """MLX_JACCL_RING for a jaccl ring, except two Macs on one cable: their matrix is also a
    mesh, which MLX then picks (one queue pair per peer, not a left and a right one on the
    same device)."""
    if not is_jaccl_ring(spec):
        return False
    return spec.world_size >= 3 or len(spec.links) > 1


def device_matrix(spec: ClusterSpec) -> list[list[Entry]]:
    """The JSON matrix MLX_IBV_DEVICES points at, in rank order."""
    if not is_jaccl_ring(spec):
        return [list(node.rdma or []) for node in spec.nodes]
    index = {node.name: rank for rank, node in enumerate(spec.nodes)}
    cables: list[list[list[str]]] = [[[] for _ in spec.nodes] for _ in spec.nodes]
    for link in spec.links:
        a, b = (index[name] for name in link.between)
        rdma = link.rdma or ["", ""]
        cables[a][b].append(rdma[0])
        cables[b][a].append(rdma[1])
    return [[_entry(devices) for devices in row] for row in cables]


def _entry(devices: list[str]) -> Entry:
    if not devices:
        return None
    return devices[0] if len(devices) == 1 else devices


def node_devices(spec: ClusterSpec) -> dict[str, list[NodeDevice]]:
    """Each node's RDMA devices with the peer they face (empty unless jaccl)."""
    found: dict[str, list[NodeDevice]] = {node.name: [] for node in spec.nodes}
    if spec.cluster.backend != "jaccl":
        return found
    if is_jaccl_ring(spec):
        for k, link in enumerate(spec.links):
            for side, device in enumerate(link.rdma or []):
                owner, other = link.between[side], link.between[1 - side]
                if owner in found and device:
                    found[owner].append(NodeDevice(device, other, f"links[{k}].rdma[{side}]"))
        return found
    for index, node in enumerate(spec.nodes):
        for peer, name in enumerate(node.rdma or []):
            if name and peer < len(spec.nodes):
                field = f"nodes[{index}].rdma[{peer}]"
                found[node.name].append(NodeDevice(name, spec.nodes[peer].name, field))
    return found


def ring_device_issues(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    """A jaccl ring: no `rdma` on the nodes too, and each device on one cable only."""
    if not is_jaccl_ring(spec):
        return
    for index, node in enumerate(spec.nodes):
        if node.rdma is not None:
            yield ConfigIssue(
                f"nodes[{index}].rdma",
                "is set together with [[links]]: rdma on the nodes is a full mesh, "
                "[[links]] with rdma a ring of cables",
                "keep one: remove rdma from [[nodes]] for a ring, or [[links]] for a mesh",
            )
    for name, devices in node_devices(spec).items():
        first: dict[str, NodeDevice] = {}
        for device in devices:
            if device.device not in first:
                first[device.device] = device
                continue
            yield ConfigIssue(
                device.field,
                f"{device.device} on {name} is given for more than one cable (also at "
                f"{first[device.device].field})",
                "one device per Thunderbolt port: name the port each cable is in "
                "(ibv_devices lists them)",
            )
