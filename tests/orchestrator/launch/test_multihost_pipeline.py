"""Pipeline placement across network namespaces: three hosts with memory_gb 2 : 1 : 1
serve a model with the layers split by memory, exactly as one rank does. The model is the
tiny one with the bundled model's head counts (9 / 3: no tensor split at 2 ranks) and
8 layers: the point is the hosts and the split, not the weights."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import openai
import pytest

from testkit.netns import HostsFactory
from testkit.nine_heads import write_nine_heads_model
from testkit.orchestrator_process import run_cli, running, write_cluster
from testkit.rank_cluster import rank_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPT = "The capital of France is"
LAYERS = 8


def complete(base_url: str, model: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300)
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0
    ).choices[0].text


def test_three_hosts_split_by_memory_serve_like_one_rank(
    netns_hosts: HostsFactory, tmp_path: Path
) -> None:
    """parallel = "pipeline", memory_gb 2 : 1 : 1: the first host holds half the
    layers, every rank loads only its range, and greedy output equals one rank's."""
    model = write_nine_heads_model(tmp_path / "nine-heads", LAYERS)
    with rank_cluster(tmp_path / "one", model, 1, served_model_id="m") as one:
        reference = complete(one.base_url, "m")
    net = netns_hosts(3, "switch")
    nodes = [net.node(i) | {"memory_gb": gb} for i, gb in enumerate((2.0, 1.0, 1.0))]
    config = write_cluster(
        tmp_path, str(model), nodes,
        cluster={"parallel": "pipeline"}, supervisor={"standby_ranks": False},
    )
    planned = run_cli("plan", str(config), "--json")
    assert planned.returncode == 0, planned.stderr
    layers = [tuple(rank["layers"]) for rank in json.loads(planned.stdout)["placement"]["ranks"]]
    # 2 : 1 : 1 of 8 equal layers; rank 0 holds the last ones (mlx-lm's pipeline order).
    assert layers == [(4, LAYERS), (2, 4), (0, 2)], layers
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url) as orchestrator:
        assert complete(url, model.name) == reference
        for rank, (start, end) in enumerate(layers):
            assert f"pipeline stage with layers [{start}, {end}) {rank}/3" in orchestrator.text
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
