"""Each node's fingerprint from the config alone: memory_gb (or --memory-gb) stands in for
the probe, even for a local node; a local node without it is this machine, measured; an ssh
node without it is unknown."""

from __future__ import annotations

import pytest

from contract.fingerprint import MemoryInfo, NodeFingerprint, OsInfo, PythonInfo
from orchestrator.placement.decide import _budgets
from orchestrator.placement.stand_in import (
    UnknownNodeName,
    memory_source,
    stand_in_prints,
    unknown_memory,
    with_memory,
)
from testkit.config_files import memory_cluster

GIB = 1024**3
HERE = NodeFingerprint(
    hostname="here", os=OsInfo(system="Linux", name="Debian", version="12", kernel="6"),
    arch="x86_64", boot_id="b1", memory=MemoryInfo(total_bytes=24 * GIB, available_bytes=20 * GIB),
    python=PythonInfo(version="3.12", executable="python3", implementation="CPython"),
)


def test_memory_gb_stands_in_even_for_a_local_node() -> None:
    """Local n0 with memory_gb 190 (the Studio the plan is for): its budget is 190 GiB,
    not this laptop's 20; local n1 without: this machine's available memory less the
    reserve, shared by the two."""
    spec = memory_cluster([190, None], transport="local")
    measured = {"n0": HERE, "n1": HERE}
    prints = stand_in_prints(spec, None, measured)
    budgets = _budgets(spec, prints, {"n0": 2, "n1": 2})
    assert budgets == [190 * GIB, (20 - 2) * GIB / 2]
    assert unknown_memory(spec, measured) == []
    assert memory_source(spec, measured, {}) == {
        "n0": "190 GiB from memory_gb", "n1": 'measured at this machine (transport = "local")'}


def test_an_ssh_node_without_memory_is_unknown() -> None:
    """No memory_gb and no measurement: unknown (its budget would be None: unlimited)."""
    spec = memory_cluster([4, None])
    assert unknown_memory(spec, {}) == ["n1"]
    given = with_memory(spec, {"n1": 8})
    assert unknown_memory(given, {}) == []
    assert memory_source(given, {}, {"n1": 8}) == {
        "n0": "4 GiB from memory_gb", "n1": "8 GiB from --memory-gb"}


def test_a_local_node_whose_memory_could_not_be_read_is_unknown() -> None:
    """This machine's probe without memory (no psutil): unknown, as an ssh node's."""
    spec = memory_cluster([None], transport="local")
    assert unknown_memory(spec, {"n0": HERE}) == []
    unread = NodeFingerprint(hostname="here", os=HERE.os, arch="x86_64", python=HERE.python)
    assert unknown_memory(spec, {"n0": unread}) == ["n0"]


def test_memory_for_an_unknown_node_is_refused() -> None:
    with pytest.raises(UnknownNodeName, match="names x, not a node of this cluster"):
        with_memory(memory_cluster([4]), {"x": 1})
