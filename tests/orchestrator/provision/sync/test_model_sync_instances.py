"""`orchestrator sync` of a two-instance file to two namespace hosts: each host gets only
its instance's model."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from testkit.netns import HostsFactory, PrivateTmpfs
from testkit.orchestrator_process import write_cluster
from testkit.sync_runs import NO_STANDBY, by_node, place_model, same_model, sync

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_each_host_gets_only_the_model_of_its_instance(
    netns_hosts: HostsFactory, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """big to h0 (instance main), small to h1 (instance fast); the JSON names them."""
    mount, big = place_model(tmp_path, tiny_model_dir)
    small = mount / "small"
    shutil.copytree(big, small)
    net = netns_hosts(2, "switch", PrivateTmpfs(str(mount), "128m"))
    nodes = [net.node(0), net.node(1)]
    config = write_cluster(tmp_path, str(big), nodes, **NO_STANDBY)
    data = tomllib.loads(config.read_text())
    data["instances"] = [
        {"name": "main", "model": str(big), "id": "big", "nodes": [nodes[0]["name"]]},
        {"name": "fast", "model": str(small), "id": "small", "nodes": [nodes[1]["name"]]},
    ]
    config.write_text(tomli_w.dumps(data))
    code, report = sync(config)
    assert code == 0 and report["ok"], report
    models = {m["path"]: m for m in report["models"]}
    assert models[str(big)]["instances"] == ["main"]
    assert models[str(small)]["instances"] == ["fast"]
    assert set(by_node(models[str(big)])) == {nodes[0]["name"]}
    assert set(by_node(models[str(small)])) == {nodes[1]["name"]}
    assert same_model(net, 0, big, tiny_model_dir) and same_model(net, 1, small, tiny_model_dir)
    assert not net.hosts[0].path(small).exists() and not net.hosts[1].path(big).exists()
