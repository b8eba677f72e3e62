"""contract/fingerprint.py: a node's usable memory, ranks sharing a machine, addresses."""

from __future__ import annotations

import pytest

from contract.agent_protocol import FingerprintResult, decode_agent_message, encode
from contract.fingerprint import (
    METAL_DEFAULT_WIRED_SHARE,
    MemoryInfo,
    NetInterface,
    NodeFingerprint,
    OsInfo,
    PythonInfo,
    RdmaDevice,
    RdmaPort,
    ranks_on_machine,
    ranks_per_machine,
)

GIB = 1024**3


def node(
    system: str = "Linux",
    memory: MemoryInfo | None = None,
    boot_id: str | None = None,
    **fields: object,
) -> NodeFingerprint:
    return NodeFingerprint(
        hostname="n",
        os=OsInfo(system=system, name=system, version="1", kernel="k"),
        arch="arm64" if system == "Darwin" else "x86_64",
        python=PythonInfo(version="3.11.7", executable="/usr/bin/python3", implementation="cp"),
        memory=memory,
        boot_id=boot_id,
        **fields,  # type: ignore[arg-type]
    )


def test_linux_may_use_what_is_available_else_the_total() -> None:
    """Linux: available memory, the total when unknown, None when unmeasured."""
    linux = node(memory=MemoryInfo(total_bytes=64 * GIB, available_bytes=40 * GIB))
    assert linux.usable_memory_bytes() == 40 * GIB
    assert node(memory=MemoryInfo(total_bytes=64 * GIB)).usable_memory_bytes() == 64 * GIB
    assert node(memory=None).usable_memory_bytes() is None


@pytest.mark.parametrize(
    ("fields", "usable"),
    [
        # iogpu.wired_limit_mb set: it wins over Metal's recommendation
        ({"gpu_wired_limit_mb": 100 * 1024, "gpu_working_set_bytes": 90 * GIB}, 100 * GIB),
        # 0 = the system default: Metal's recommended working set
        ({"gpu_wired_limit_mb": 0, "gpu_working_set_bytes": 90 * GIB}, 90 * GIB),
        # neither known: the default share of RAM
        ({}, int(128 * GIB * METAL_DEFAULT_WIRED_SHARE)),
        # never more than is available
        ({"gpu_wired_limit_mb": 200 * 1024}, 120 * GIB),
    ],
)
def test_a_mac_may_use_the_gpus_wired_limit_at_most_what_is_available(
    fields: dict[str, int], usable: int
) -> None:
    """macOS: the wired limit, else Metal's working set, else a share of RAM; capped."""
    memory = MemoryInfo(total_bytes=128 * GIB, available_bytes=120 * GIB)
    assert node("Darwin", memory, **fields).usable_memory_bytes() == usable


def test_nodes_with_one_boot_id_share_one_machine() -> None:
    """Nodes on one kernel count each other; nodes without a boot_id are left out."""
    nodes = {
        "a": node(boot_id="k1"),
        "b": node(boot_id="k1"),
        "c": node(boot_id="k2"),
        "mac": node("Darwin"),  # no boot_id: not counted, not guessed
    }
    assert ranks_on_machine(nodes) == {"a": 2, "b": 2, "c": 1}
    assert ranks_on_machine({}) == {}


def test_addresses_of_every_interface_and_an_rdma_device_is_active_by_any_port() -> None:
    """A node owns every interface's address; an RDMA device is up if any port is."""
    fp = node(
        interfaces=[
            NetInterface(name="en0", addresses=["10.0.0.2", "fe80::1"]),
            NetInterface(name="en2", addresses=["192.168.9.1"]),
        ]
    )
    assert fp.addresses() == {"10.0.0.2", "fe80::1", "192.168.9.1"}
    down = RdmaPort(port=1, state="PORT_DOWN", active=False)
    up = RdmaPort(port=2, state="PORT_ACTIVE", active=True)
    assert RdmaDevice(name="rdma_en2", ports=[down, up]).active
    assert not RdmaDevice(name="rdma_en3", ports=[down]).active


def test_a_fingerprint_crosses_the_wire_unchanged() -> None:
    """A fingerprint with its optional and missing parts survives the protocol."""
    fp = node(
        "Darwin",
        MemoryInfo(total_bytes=8 * GIB, available_bytes=None),
        packages={"mlx": "0.32.4", "mlx-metal": None},
        unavailable={"rdma": "rdma_ctl not found on PATH"},
    )
    message = decode_agent_message(encode(FingerprintResult(id=4, fingerprint=fp)))
    assert message == FingerprintResult(id=4, fingerprint=fp)


def test_ranks_of_every_instance_on_one_machine_are_counted_together() -> None:
    """Two one-rank replicas on nodes of one kernel: 2 ranks there; a node carrying ranks
    of two instances counts both; a machine no rank uses is left out."""
    prints = {"r0": node(boot_id="k1"), "r1": node(boot_id="k1"), "far": node(boot_id="k2"),
              "idle": node(boot_id="k3"), "mac": node("Darwin")}
    assert ranks_per_machine(["r0", "r1"], prints) == {"r0": 2, "r1": 2}
    assert ranks_per_machine(["r0", "r0", "far", "mac"], prints) == {
        "r0": 2, "r1": 2, "far": 1}
