"""Checks that every node can run the job, before anything is launched.

Each check reads the nodes' fingerprints and yields failures naming the node, what was
found and the fix; `up` reports all of them at once and exits 2.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.config.jaccl_devices import node_devices
from orchestrator.config.links import rank_addresses
from orchestrator.placement.decide import Refusal, place
from orchestrator.preflight.failure import PreflightFailure
from orchestrator.preflight.macs import mac_preflight
from orchestrator.preflight.model import model_preflight

GIB = 1024**3
# The project itself is compared by the digest of the code the agent runs.
PACKAGES = ("mlx", "mlx-lm", "mlx-metal")
# JACCL (RDMA over Thunderbolt) shipped in macOS 26.2.
JACCL_MIN_MACOS = (26, 2)
# Makes a venv on every node with the orchestrator's own versions, from pushed wheels.
BOOTSTRAP_FIX = "run `orchestrator bootstrap cluster.toml`"


Fingerprints = Mapping[str, NodeFingerprint]


def run_preflight(
    spec: ClusterSpec,
    fingerprints: Fingerprints,
    busy_ports: Mapping[str, list[str]] | None = None,
    placement: Placement | Refusal | None = None,
) -> list[PreflightFailure]:
    """`placement`: what orchestrator.placement.place decided for these fingerprints
    (decided here when not given)."""
    if placement is None:
        placement = place(spec, fingerprints)
    checks = (_versions, _memory_caps, _addresses, _jaccl)
    failures = [failure for check in checks for failure in check(spec, fingerprints)]
    failures += mac_preflight(spec, fingerprints)
    failures += model_preflight(spec, fingerprints, placement)
    if isinstance(placement, Refusal):
        failures.append(
            PreflightFailure(placement.node, placement.check, placement.found, placement.fix)
        )
    for node, endpoints in (busy_ports or {}).items():
        for endpoint in endpoints:
            failures.append(
                PreflightFailure(
                    node,
                    "ports",
                    f"{endpoint} is already in use",
                    "stop what listens there (a leftover run? try "
                    "`orchestrator down`) or change the port in cluster.toml",
                )
            )
    return failures


# What every rank imports, and what rank 0 adds for its API.
RANK_PACKAGES = ("mlx", "mlx-lm", "msgspec")
RANK0_PACKAGES = ("litestar", "uvicorn", "prometheus-client")


def _versions(spec: ClusterSpec, prints: Fingerprints) -> Iterator[PreflightFailure]:
    reference_name = spec.nodes[0].name
    reference = prints[reference_name]
    for rank, node in enumerate(spec.nodes):
        fingerprint = prints[node.name]
        required = RANK_PACKAGES + (RANK0_PACKAGES if rank == 0 else ())
        for package in required:
            if fingerprint.packages.get(package) is None:
                yield PreflightFailure(
                    node.name,
                    "versions",
                    f"{package} is not installed for {fingerprint.python.executable}",
                    f"{BOOTSTRAP_FIX}; or pip install {package} with that interpreter",
                )
        if node.name == reference_name:
            continue
        for field, ours, theirs in _version_fields(reference, fingerprint):
            if ours != theirs:
                yield PreflightFailure(
                    node.name,
                    "versions",
                    f"{field} {theirs} differs from {ours} on {reference_name}",
                    f"{BOOTSTRAP_FIX}: it gives {node.name} a venv with the orchestrator's "
                    "versions (set [bootstrap] venv or the node's venv first); all ranks need "
                    "the same versions",
                )


def _version_fields(a: NodeFingerprint, b: NodeFingerprint) -> Iterator[tuple[str, str, str]]:
    # Ranks exchange raw tensors and msgpack plans, so a different Python patch release is
    # harmless; a different minor release usually means different wheels.
    yield "python", _minor(a.python.version), _minor(b.python.version)
    for package in PACKAGES:
        yield package, str(a.packages.get(package)), str(b.packages.get(package))
    if a.code_digest and b.code_digest:
        yield "orchestrator code", a.code_digest, b.code_digest


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _memory_caps(spec: ClusterSpec, prints: Fingerprints) -> Iterator[PreflightFailure]:
    """A node's memory_gb may only lower what placement counts on, never raise it."""
    for index, node in enumerate(spec.nodes):
        memory = prints[node.name].memory
        if node.memory_gb is None or memory is None or node.memory_gb * GIB <= memory.total_bytes:
            continue
        yield PreflightFailure(
            node.name,
            "memory",
            f"nodes[{index}].memory_gb = {node.memory_gb:g} is above the node's "
            f"{memory.total_bytes / GIB:.1f} GiB of memory",
            f"set nodes[{index}].memory_gb to at most {memory.total_bytes / GIB:.1f}, or "
            "remove it to use what the node has",
        )


def _addresses(spec: ClusterSpec, prints: Fingerprints) -> Iterator[PreflightFailure]:
    """Each rank listens on its addresses: its node must own every one of them."""
    for node, addresses in zip(spec.nodes, rank_addresses(spec), strict=True):
        owned = prints[node.name].addresses()
        for address in addresses:
            if address.ip in owned:
                continue
            listed = ", ".join(sorted(owned)) or "none"
            yield PreflightFailure(
                node.name,
                "address",
                f"does not own {address.ip}, given by {address.field} (its addresses: {listed})",
                f"set {address.field} to one of its addresses, or configure {address.ip} on "
                "its Thunderbolt interface for that link",
            )


def _jaccl(spec: ClusterSpec, prints: Fingerprints) -> Iterator[PreflightFailure]:
    if spec.cluster.backend != "jaccl":
        return
    jaccl_devices = {name: [d.device for d in found] for name, found in node_devices(spec).items()}
    for node in spec.nodes:
        yield from _jaccl_node(node.name, jaccl_devices[node.name], prints[node.name])


def _jaccl_node(
    name: str, devices: list[str], fingerprint: NodeFingerprint
) -> Iterator[PreflightFailure]:
    if fingerprint.os.system != "Darwin":
        yield PreflightFailure(
            name,
            "jaccl",
            f"runs {fingerprint.os.name}; JACCL is RDMA over Thunderbolt 5 on macOS only",
            'use backend = "ring" on this cluster',
        )
        return
    if _version_tuple(fingerprint.os.version) < JACCL_MIN_MACOS:
        yield PreflightFailure(
            name,
            "jaccl",
            f"runs macOS {fingerprint.os.version}",
            "update to macOS 26.2 or later (JACCL needs it)",
        )
    rdma = fingerprint.rdma
    if rdma is None or rdma.status != "enabled":
        status = "unavailable" if rdma is None else rdma.status
        yield PreflightFailure(
            name,
            "jaccl",
            f"RDMA is {status}",
            "boot into recovery mode, run `rdma_ctl enable`, reboot",
        )
        return
    by_name = {device.name: device for device in rdma.devices}
    for device in filter(None, devices):
        if device not in by_name and device not in rdma.device_names:
            present = ", ".join(sorted(set(by_name) | set(rdma.device_names))) or "none"
            yield PreflightFailure(
                name,
                "jaccl",
                f"RDMA device {device} not found (present: {present})",
                "check the cable and the rdma list of this node (ibv_devices)",
            )
        elif device in by_name and not by_name[device].active:
            yield PreflightFailure(
                name,
                "jaccl",
                f"RDMA device {device} has no PORT_ACTIVE port",
                "check the Thunderbolt 5 cable between the two nodes",
            )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)
