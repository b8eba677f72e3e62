"""Pipeline placement across network namespaces: three hosts with memory_gb 2 : 1 : 1
serve the bundled model with the layers split by memory, exactly as one rank does."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import openai
import pytest

from testkit.netns import HostsFactory
from testkit.orchestrator_process import run_cli, running, write_cluster
from testkit.rank_cluster import rank_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPT = "The capital of France is"


def complete(base_url: str, model: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300)
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0
    ).choices[0].text


def test_three_hosts_split_by_memory_serve_like_one_rank(
    netns_hosts: HostsFactory, tmp_path: Path, bundled_model_dir: Path
) -> None:
    """parallel = "pipeline", memory_gb 2 : 1 : 1: the first host holds about half the
    layers, every rank loads only its range, and greedy output equals one rank's."""
    with rank_cluster(tmp_path / "one", bundled_model_dir, 1, served_model_id="m") as one:
        reference = complete(one.base_url, "m")
    net = netns_hosts(3, "switch")
    nodes = [net.node(i) | {"memory_gb": gb} for i, gb in enumerate((2.0, 1.0, 1.0))]
    config = write_cluster(
        tmp_path, "bundled:smollm2-135m-instruct", nodes,
        cluster={"parallel": "pipeline"}, supervisor={"standby_ranks": False},
    )
    planned = run_cli("plan", str(config), "--json")
    assert planned.returncode == 0, planned.stderr
    layers = [tuple(rank["layers"]) for rank in json.loads(planned.stdout)["placement"]["ranks"]]
    first = layers[0][1] - layers[0][0]
    assert layers[0][1] == 30 and layers[2][0] == 0 and 13 <= first <= 17, layers
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, url=url) as orchestrator:
        assert complete(url, "smollm2-135m-instruct") == reference
        for rank, (start, end) in enumerate(layers):
            assert f"pipeline stage with layers [{start}, {end}) {rank}/3" in orchestrator.text
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
