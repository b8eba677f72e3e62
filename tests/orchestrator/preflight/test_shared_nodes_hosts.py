"""Two instances sharing one namespace host over SSH: `up` sums their memory at preflight
and refuses, with the numbers, when the node's memory_gb holds one but not both."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import pytest
import tomli_w

from contract.placement import Placement
from orchestrator.config import NodeSpec
from orchestrator.config.instances import instance_specs
from orchestrator.config.load import check_cluster_data
from orchestrator.placement.decide import place
from orchestrator.transports import LocalTransport
from testkit.netns import HostsFactory
from testkit.orchestrator_process import run_cli, write_cluster

pytestmark = pytest.mark.e2e

GIB = 1024**3


def _instances(model: str) -> list[dict[str, object]]:
    return [{"name": "main", "model": model, "id": "main", "nodes": ["h0"]},
            {"name": "fast", "model": model, "id": "fast", "nodes": ["h0"]}]


def _need_bytes(model: Path) -> int:
    """What one instance places on h0 (weights and one full-context sequence of KV), as
    preflight estimates it from this machine's real fingerprint."""
    async def fingerprint() -> object:
        async with LocalTransport(NodeSpec(name="local")) as transport:
            return await (await transport.start_agent()).fingerprint(str(model))
    prints = {"h0": asyncio.run(fingerprint())}
    data = {"nodes": [{"name": "h0", "ip": "127.0.0.1"}], "instances": _instances(str(model))}
    spec = check_cluster_data(data, Path("probe.toml"))[0]
    placement = place(instance_specs(spec)["main"], prints)  # type: ignore[arg-type]
    assert isinstance(placement, Placement)
    return placement.ranks[0].weight_bytes + placement.ranks[0].kv_bytes


def test_two_instances_on_one_host_that_holds_one_are_refused_with_the_numbers(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """h0's memory_gb holds 1.5 instances: `up` exits 2 before launching, naming h0, both
    instances' shares and their sum."""
    net = netns_hosts(1, "switch")
    need = _need_bytes(tiny_model_dir)
    node = net.node(0, memory_gb=1.5 * need / GIB)
    config = write_cluster(tmp_path, str(tiny_model_dir), [node],
                           preflight={"reserve_memory_gb": 0})
    data = tomllib.loads(config.read_text())
    data["instances"] = _instances(str(tiny_model_dir))
    config.write_text(tomli_w.dumps(data))
    result = run_cli("up", str(config), timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "instances sharing a node do not fit together" in output, output
    assert "[memory] h0:" in output and "main " in output and "fast " in output, output
    assert "nothing was launched" in output and "rank 0 of" not in output, output
