"""Pipeline mode: `orchestrator sync` sends each namespace host only the shards holding its
rank's layers (plus the files every stage loads), preflight accepts those subsets, and the
hosts serve exactly what one rank serves from the whole model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import openai
import pytest

from node_agent.models.store import SYNC_MARKER
from serving.model.bundled import default_cache_dir
from testkit.netns import HostsFactory, PrivateTmpfs
from testkit.orchestrator_process import run_cli, running, write_cluster
from testkit.rank_cluster import rank_cluster
from testkit.sharded_model import write_sharded_copy
from testkit.sync_runs import NO_STANDBY, WIRE_FRAMING
from testkit.tiny_model import write_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LAYERS, PER_SHARD = 6, 2


def complete(base_url: str, model: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300)
    reply = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
    return reply.choices[0].text


def test_pipeline_hosts_receive_only_their_shards_and_serve_like_one_rank(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """3 empty hosts, 6 layers in 3 layer shards + 1 shared shard: each host gets the
    shared shard and its own layers' shard only (files on disk, bytes on its link), the
    cluster passes preflight and its greedy output equals one rank's on the whole model."""
    tiny = write_tiny_model(
        tmp_path / "tiny", num_layers=LAYERS, model_cache_dir=default_cache_dir()
    )
    mount = tmp_path / "models"
    model = mount / "sharded"
    shared, *layer_shards = write_sharded_copy(tiny, model, PER_SHARD)
    with rank_cluster(tmp_path / "one", model, 1, served_model_id="m") as one:
        reference = complete(one.base_url, "m")
    net = netns_hosts(3, "switch", PrivateTmpfs(str(mount), "128m"))
    nodes = [net.node(i) | {"memory_gb": 1.0} for i in range(3)]
    config = write_cluster(
        tmp_path, str(model), nodes, cluster={"parallel": "pipeline"},
        model={"sync": True}, **NO_STANDBY,
    )
    before = [net.mgmt_bytes_in(i) for i in range(3)]
    done = run_cli("sync", str(config), "--json", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    whole = {p.name: p.stat().st_size for p in model.iterdir()}
    assert report["total_bytes"] == sum(whole.values())
    for i, node in enumerate(report["nodes"]):
        start, end = node["layers"]
        mine = {layer_shards[n // PER_SHARD] for n in range(start, end)}
        expected = {name for name in whole if not name.startswith("model-")} | {shared} | mine
        held = {p.name for p in net.hosts[i].path(model).iterdir() if p.name != SYNC_MARKER}
        assert held == expected, (i, node["layers"], sorted(held))
        need = sum(whole[name] for name in expected)
        assert node["status"] == "synced" and node["need_bytes"] == need == node["sent_bytes"]
        received = net.mgmt_bytes_in(i) - before[i]
        assert need <= received <= need * WIRE_FRAMING + 2e6, (i, received, need)
        assert len(mine) < len(layer_shards)  # the other stages' shards never went there
    # Every layer is on exactly one host.
    assert sorted(n for node in report["nodes"] for n in range(*node["layers"])) == list(
        range(LAYERS)
    )
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url) as orchestrator:  # sync = true: finds every host current
        assert complete(url, "sharded") == reference
        assert orchestrator.text.count("already holds its files") == 3, orchestrator.text
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
