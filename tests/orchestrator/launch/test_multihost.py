"""Clusters across network namespaces: each node a host with its own sshd and addresses.

They serve the tiny model with the bundled model's head counts (9 / 3: tensor parallel at
3 ranks, pipeline at 2, as the bundled model): the point is the hosts, not the weights.
The ring's hosts are built once for the two tests that use them."""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import tomli_w

from orchestrator.launch import launch_secret
from orchestrator.tls import pinned
from testkit.netns import HostsFactory, MultiHost
from testkit.nine_heads import write_nine_heads_model
from testkit.orchestrator_process import (
    Orchestrator,
    rank0_headers,
    run_cli,
    running,
    write_cluster,
)
from testkit.rank_cluster import rank_cluster
from testkit.shared_hosts import shared_hosts
from testkit.waiting import metric_value

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTS = ["The capital of France is"]
# Tokens per answer: each a step of 3 ranks (the ring) on (here) 2 cores, whose
# collectives busy-poll.
TOKENS = 6
SERVED = "nine-heads"  # the model's directory name: the id the cluster serves it as
# Standby ranks would start (and import MLX) while the test talks to the cluster: off.
RUNS = ".cache/mlx-cluster-orchestrator/runs/test"  # rank directories, under the node's home
NO_STANDBY = {"supervisor": {"standby_ranks": False, "stop_grace_s": 3.0}}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 9 heads / 3 KV heads, 4 layers."""
    return write_nine_heads_model(tmp_path_factory.mktemp("model") / SERVED, num_layers=4)


@pytest.fixture(scope="module")
def one_rank_text(tmp_path_factory: pytest.TempPathFactory, model: Path) -> list[str]:
    """Greedy completions of PROMPTS by the model on one rank: the reference."""
    with rank_cluster(tmp_path_factory.mktemp("one"), model, 1, served_model_id="m") as cluster:
        return [complete(cluster.base_url, "m", prompt) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    """3 hosts cabled in a ring, for the tests below that use them: each leaves them as
    it found them (no process but sshd, every cable clear)."""
    with shared_hosts(tmp_path_factory, 3, "ring") as net:
        yield net


def complete(base_url: str, model: str, prompt: str) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300)
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                          temperature=0)
    return reply.choices[0].text


def ring_cluster(tmp_path: Path, net: MultiHost, model: Path) -> Path:
    """cluster.toml for the ring hosts: no node `ip`, the cables in [[links]]."""
    config = write_cluster(
        tmp_path, str(model), [net.node(i) for i in range(len(net.hosts))], **NO_STANDBY
    )
    data = tomllib.loads(config.read_text())
    data["links"] = net.links()
    config.write_text(tomli_w.dumps(data))
    return config


def api_url(config: Path) -> str:
    api = tomllib.loads(config.read_text())["api"]
    return f"http://{api['host']}:{api['port']}"



def blas_line(output: str, node: str) -> str:
    """The BLAS line of the rank on `node` in the orchestrator's output."""
    lines = output.splitlines()
    return next((line for line in lines if f"[{node} r" in line and "BLAS:" in line), "")


# Sent from another host straight to rank 0, around the gateway: prints each answer's
# status and error code as JSON (stdlib only: no import time to wait for).
STRANGER = """
import json, ssl, sys, urllib.request, urllib.error
base, name, secret = sys.argv[1:4]
tls = ssl._create_unverified_context()  # a stranger without the certificate: TLS, unpinned
chat = json.dumps({"model": "nine-heads", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Hi"}]}).encode()
answers = []
for header in (None, "wrong-" + secret[6:], secret):
    for path, body in (("/v1/models", None), ("/v1/chat/completions", chat)):
        if header == secret and body is not None:
            continue  # the right secret is shown on /v1/models only: nothing generated
        request = urllib.request.Request(base + path, data=body)
        request.add_header("Content-Type", "application/json")
        if header is not None:
            request.add_header(name, header)
        try:
            with urllib.request.urlopen(request, timeout=20, context=tls) as reply:
                answers.append([path, reply.status, None])
        except urllib.error.HTTPError as exc:
            answers.append([path, exc.code, json.loads(exc.read())["error"]["code"]])
print(json.dumps(answers))
"""


def generated(rank0: str, tls_cert: str) -> tuple[float, ...]:
    """Rank 0's own counters of work done (its /metrics is open, as the gateway's; over
    TLS pinned to the launch's certificate)."""
    names = ("serving_prompt_tokens_total", "serving_generation_tokens_total",
             "serving_requests_finished_total")
    return tuple(metric_value(rank0, name, verify=pinned(tls_cert)) for name in names)


def rank0_refuses_another_host(net: MultiHost, config: Path, orchestrator: Orchestrator) -> None:
    """From h1, rank 0 on h0 answers /v1 only with the launch's secret: none or a wrong
    one is a 401 and generates nothing; the gateway's requests still succeed. The secret
    reached rank 0 as an owner-only file, and no log line carries it."""
    port = tomllib.loads(config.read_text())["serving"]["rank_api_port"]
    rank0 = f"https://{net.hosts[0].mgmt_ip}:{port}"  # TLS beyond loopback
    record = launch_secret.load(Path(tomllib.loads(config.read_text())["cluster"]["state_dir"]),
                                "test")
    assert record is not None and record.tls_cert
    before = generated(rank0, record.tls_cert)
    assert before[0] > 0  # the gateway's requests counted: the counters are real
    ((name, secret),) = rank0_headers(config).items()
    run = net.hosts[1].run([sys.executable, "-c", STRANGER, rank0, name, secret])
    assert run.returncode == 0, run.stderr
    refused = 401, "invalid_api_key"
    assert json.loads(run.stdout) == [
        ["/v1/models", *refused], ["/v1/chat/completions", *refused],
        ["/v1/models", *refused], ["/v1/chat/completions", *refused],
        ["/v1/models", 200, None],
    ]
    assert generated(rank0, record.tls_cert) == before
    # The gateway still gets through (its completions above did, with this same secret);
    # /v1/models: a completion costs here ~25 s of a loaded machine and proves no more.
    assert httpx.get(f"{api_url(config)}/v1/models", timeout=30).status_code == 200
    kept = launch_secret.load(Path(tomllib.loads(config.read_text())["cluster"]["state_dir"]),
                              "test")
    assert kept is not None
    delivered = net.hosts[0].path(Path.home() / RUNS / kept.launch_id / "rank0" / "launch_secret")
    assert delivered.read_text() == secret and delivered.stat().st_mode & 0o777 == 0o600
    assert secret not in orchestrator.text


def serve_and_compare(
    net: MultiHost,
    config: Path,
    reference: list[str],
    also: Callable[[Orchestrator], None] = lambda _: None,
) -> None:
    """`also`: more checks while the cluster serves."""
    url = api_url(config)
    with running(config, url=url) as orchestrator:
        assert [complete(url, SERVED, p) for p in PROMPTS] == reference
        also(orchestrator)
        status = json.loads(run_cli("status", str(config), "--json").stdout)
        assert [(n["name"], n["connected"]) for n in status["nodes"]] == [
            (host.name, True) for host in net.hosts
        ]
        assert [r["state"] for r in status["ranks"]] == ["running"] * len(net.hosts)
        # One kernel under every host: the plan has the ranks split its cores for OpenBLAS.
        threads = max(1, len(os.sched_getaffinity(0)) // len(net.hosts))
        for host in net.hosts:
            assert f"{threads} threads" in blas_line(orchestrator.text, host.name)
        assert run_cli("down", str(config)).returncode == 0
        assert orchestrator.wait_exit() == 0
    assert net.only_sshd_left()


def test_two_hosts_on_a_switch_serve_like_one_rank(
    netns_hosts: HostsFactory, tmp_path: Path, model: Path, one_rank_text: list[str]
) -> None:
    """2 SSH nodes, one subnet (pipeline: 9 heads): greedy output equals 1 rank; rank 0
    refuses requests from another host that lack the launch's secret; status shows them;
    down cleans. (3 hosts in tensor parallel: the ring test below.)"""
    net = netns_hosts(2, "switch")
    config = write_cluster(tmp_path, str(model), [net.node(i) for i in range(2)], **NO_STANDBY)
    serve_and_compare(
        net, config, one_rank_text, lambda up: rank0_refuses_another_host(net, config, up)
    )


def test_three_hosts_cabled_in_a_ring_serve_like_one_rank(
    ring: MultiHost, tmp_path: Path, model: Path, one_rank_text: list[str]
) -> None:
    """3 nodes, 3 point-to-point links, no shared subnet: [[links]] give the ring its
    addresses and it serves exactly as 1 rank does (in tensor parallel: 9 heads / 3)."""
    config = ring_cluster(tmp_path, ring, model)
    planned = json.loads(run_cli("plan", str(config), "--json").stdout)
    assert planned["placement"]["mode"] == "tensor", planned["placement"]
    serve_and_compare(ring, config, one_rank_text)


def test_a_dead_cable_is_refused_before_launch(
    ring: MultiHost, tmp_path: Path, model: Path
) -> None:
    """100% loss on the cable h1-h2: `up` refuses within seconds, naming that link."""
    net = ring
    net.drop_all(1, 2)
    config = ring_cluster(tmp_path, net, model)
    started = time.monotonic()
    orchestrator = Orchestrator(config)
    try:
        code = orchestrator.wait_exit(60)
    finally:
        orchestrator.stop()
        net.clear(1, 2)
    elapsed = time.monotonic() - started
    assert code == 2, orchestrator.text
    # Well before the 60 s a launch would wait (under load the probes took 13 s once).
    assert elapsed < 30, f"refused only after {elapsed:.1f} s"
    address = net.hosts[2].data_ips[1]
    rows = [line for line in orchestrator.output if address in line]
    assert rows and "h1" in rows[0] and "h2" in rows[0], orchestrator.text
    assert "links[1].ips[1]" in orchestrator.text
    assert net.only_sshd_left()
