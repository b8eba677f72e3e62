"""`up` of an hf: model across network-namespace hosts whose store is an empty private
tmpfs: the head pulls it from the local hub once, syncs it to every host, and the ranks
(offline) serve exactly what the same model serves on one local rank. The repo holds the
tiny model: the point is the pull and the sync, not the weights."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from node_agent.models.store import SYNC_MARKER
from testkit.hub_server import TEST_REPO, HubServer, ServedRepo, serve_dir
from testkit.netns import HostsFactory, PrivateTmpfs
from testkit.orchestrator_process import running, write_cluster
from testkit.rank_cluster import rank_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SERVED_AS = "SmolLM2-135M-Instruct-test"
PROMPTS = ["The capital of France is"]
TOKENS = 6
HOSTS = 2  # 3 tensor ranks on 2 cores would busy-poll for seconds a step
NO_STANDBY = {"supervisor": {"standby_ranks": False, "stop_grace_s": 3.0}}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> ServedRepo:
    """The tiny model's directory, served as TEST_REPO (the bundled 4-bit model's load and
    sync would cost seconds of CPU on each host and prove no more)."""
    return serve_dir(TEST_REPO, tiny_model_dir)


def complete(base_url: str, model: str, prompt: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300)
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                          temperature=0)
    return reply.choices[0].text


def test_up_pulls_syncs_and_serves_an_hf_model_on_empty_hosts(
    netns_hosts: HostsFactory,
    tmp_path: Path,
    hub: HubServer,
    served: ServedRepo,
    tiny_model_dir: Path,
) -> None:
    """2 hosts, nothing at the store: `up` with [model] sync pulls once at the head, syncs
    to both, and greedy output equals the same model on one local rank."""
    with rank_cluster(tmp_path / "one", tiny_model_dir, 1, served_model_id="m") as one:
        reference = [complete(one.base_url, "m", prompt) for prompt in PROMPTS]
    store = tmp_path / "store"
    snapshots = store / f"models--{TEST_REPO.replace('/', '--')}" / "snapshots"
    snapshot = snapshots / served.commit
    # Each host's own tmpfs at snapshots/ (not at the store: the hosts share ~/.cache, where
    # the agents keep a sync lock named after the model's parent directory's device).
    net = netns_hosts(HOSTS, "switch", PrivateTmpfs(str(snapshots), "256m"))
    assert not any(any(net.hosts[i].path(snapshots).iterdir()) for i in range(HOSTS))
    model = {"path": f"hf:{TEST_REPO}", "store": str(store), "sync": True}
    nodes = [net.node(i) for i in range(HOSTS)]
    config = write_cluster(tmp_path, model["path"], nodes, model=model, **NO_STANDBY)
    api = f"http://127.0.0.1:{_api_port(config)}"
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "unused-cache")}
    with running(config, env=env, url=api) as orchestrator:
        assert [complete(api, SERVED_AS, p) for p in PROMPTS] == reference
        text = orchestrator.text
    assert f"model hf:{TEST_REPO} is {snapshot} on every node" in text, text
    total = sum(f.size for f in served.files.values())
    assert sum(hub.sent.values()) == total  # pulled once, at the head
    for i in range(HOSTS):
        copy = net.hosts[i].path(snapshot)
        held = sorted(p.name for p in copy.iterdir() if p.name != SYNC_MARKER)
        assert held == sorted(served.files) and (copy / SYNC_MARKER).is_file(), i
        assert not any(p.is_symlink() for p in copy.iterdir())  # plain files on the nodes


def _api_port(config: Path) -> int:
    import tomllib

    return int(tomllib.loads(config.read_text())["api"]["port"])
