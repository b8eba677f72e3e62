"""`orchestrator up` end to end: real agents, real ranks, real model, real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract import rank_env
from orchestrator.state_file import ClusterState, RankRecord, read_state, write_state
from testkit.orchestrator_process import (
    Orchestrator,
    kill_all,
    launch_processes,
    rank0_headers,
    run_cli,
    running,
    wait_gone,
    wait_no_launch,
    write_cluster,
)
from testkit.sshd import SshdServer, run_sshd

API_KEY = "test-key-123"
KEY_ENV = {"TEST_ORCHESTRATOR_KEY": API_KEY}
HF_TOKEN = "hf_test_token_never_in_a_rank"
LOCAL3 = [{"name": f"r{i}", "ip": "127.0.0.1"} for i in range(3)]
MODEL_ID = "tiny"
# Tests that never restart their gang: no standby gang pre-started after ready (~3 s of
# CPU a rank). smollm_cluster keeps its standby ranks: the secrets test checks theirs too.
NO_STANDBY = {"standby_ranks": False}


class Cluster:
    def __init__(self, orchestrator: Orchestrator, config: Path, url: str) -> None:
        self.orchestrator, self.config, self.url = orchestrator, config, url

    def client(self, key: str = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def smollm_cluster(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[Cluster]:
    """Two local ranks of the tiny model over ring, with an API key: the orchestrator's
    surfaces (status, metrics, key, bench, down) over a real multi-rank gang, at a step's
    cost of milliseconds (3 ranks of SmolLM2 on 2 cores take seconds a step)."""
    tmp = tmp_path_factory.mktemp("up2")
    config = write_cluster(tmp, str(tiny_model_dir), LOCAL3[:2], model={"id": MODEL_ID},
                           api={"api_key_env": "TEST_ORCHESTRATOR_KEY"})
    url = _api_url(config)
    with running(config, {**KEY_ENV, "HF_TOKEN": HF_TOKEN}, url) as orchestrator:
        yield Cluster(orchestrator, config, url)


@pytest.fixture
def bundled_cluster(tmp_path: Path, bundled_model_dir: Path) -> Iterator[Cluster]:
    """One local rank of the bundled SmolLM2 behind an API key: a real model's answer."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", LOCAL3[:1],
                           api={"api_key_env": "TEST_ORCHESTRATOR_KEY"}, supervisor=NO_STANDBY)
    url = _api_url(config)
    with running(config, KEY_ENV, url) as orchestrator:
        yield Cluster(orchestrator, config, url)


def _api_url(config: Path) -> str:
    import tomllib

    api = tomllib.loads(config.read_text())["api"]
    return f"http://{api['host']}:{api['port']}"


@pytest.mark.e2e
def test_chat_through_gateway(bundled_cluster: Cluster) -> None:
    """The official openai client chats through the gateway, whole and streamed."""
    client = bundled_cluster.client()
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=question,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=6,  # "The capital of France is Paris"
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=question,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=6,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == reply.choices[0].message.content


@pytest.mark.e2e
def test_status_shows_every_rank_ready(
    smollm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status --json` and the table show the cluster ready with its 2 running ranks."""
    monkeypatch.delenv("COLUMNS", raising=False)  # the table's width is the one under test
    result = run_cli("status", str(smollm_cluster.config), "--json", env=KEY_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads(result.stdout)
    assert status["state"] == "ready"
    assert [rank["state"] for rank in status["ranks"]] == ["running"] * 2
    assert all(node["connected"] and node["mlx_version"] for node in status["nodes"])
    table = run_cli("status", str(smollm_cluster.config), env=KEY_ENV)
    assert table.returncode == 0 and "READY" in table.stdout and "r1" in table.stdout
    # Piped, not a terminal: every cell whole (rich would cut them at 80 columns).
    assert "…" not in table.stdout and "memory used/total (ranks)" in table.stdout


@pytest.mark.e2e
def test_metrics_has_both_families(smollm_cluster: Cluster) -> None:
    """/metrics parses and carries orchestrator_* and rank 0's serving_* families."""
    text = httpx.get(f"{smollm_cluster.url}/metrics", timeout=10).text
    families = list(text_string_to_metric_families(text))
    names = {family.name for family in families}
    node_up = {
        s.labels["node"]: s.value
        for f in families
        if f.name == "orchestrator_node_up"
        for s in f.samples
    }
    assert node_up == {"r0": 1.0, "r1": 1.0}
    assert {"orchestrator_state", "orchestrator_rank_up", "orchestrator_restarts"} <= names
    assert {"serving_requests_running", "serving_batch_size", "serving_steps"} <= names


@pytest.mark.e2e
def test_live_node_usage_in_metrics_and_status(smollm_cluster: Cluster) -> None:
    """Every node reports its memory and its ranks' RSS every few seconds: in /metrics and
    in `status`, fresh."""
    text = httpx.get(f"{smollm_cluster.url}/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    ranks_rss = {
        s.labels["node"]: s.value
        for s in samples
        if s.name == "orchestrator_node_memory_bytes" and s.labels["kind"] == "ranks"
    }
    assert set(ranks_rss) == {"r0", "r1"} and min(ranks_rss.values()) > 50e6
    per_rank = {s.labels["rank"] for s in samples if s.name == "orchestrator_rank_memory_bytes"}
    assert per_rank == {"0", "1"}
    status = json.loads(run_cli("status", str(smollm_cluster.config), "--json", env=KEY_ENV).stdout)
    for node in status["nodes"]:
        assert not node["usage_stale"] and node["usage_age_s"] < 10
        assert node["memory_available_bytes"] > 0 and node["memory_ranks_bytes"] > 50e6


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
    ],
)
def test_api_key_required_on_v1(smollm_cluster: Cluster, method: str, path: str) -> None:
    """Every /v1 route answers 401 in OpenAI's shape without or with a wrong key."""
    body: dict[str, object] = {"model": MODEL_ID, "max_tokens": 1}
    if path.endswith("chat/completions"):  # each route refuses the other's fields
        body["messages"] = [{"role": "user", "content": "Hi"}]
    elif path.endswith("completions"):
        body["prompt"] = "Hi"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.request(method, f"{smollm_cluster.url}{path}", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    good = httpx.request(
        method,
        f"{smollm_cluster.url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=300,
    )
    assert good.status_code == 200, good.text


@pytest.mark.e2e
def test_health_needs_no_key(smollm_cluster: Cluster) -> None:
    """/health stays open when an API key is set."""
    response = httpx.get(f"{smollm_cluster.url}/health")
    assert response.status_code == 200 and response.json()["status"] == "ready"


@pytest.mark.e2e
def test_bench_measures_the_cluster(smollm_cluster: Cluster) -> None:
    """`orchestrator bench --json` streams through the gateway: every stream done, sane figures."""
    # 4 tokens a stream: gaps to measure.
    result = run_cli("bench", str(smollm_cluster.config), "--json", "--streams", "2",
                     "--tokens", "4", "--prompt-tokens", "100", env=KEY_ENV, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    assert figures["errors"] == 0 and figures["error_messages"] == []
    assert figures["streams"] == 2 and 2 <= figures["tokens"] <= 2 * 4
    assert 50 <= figures["prompt_tokens"] <= 200  # the server's count of "about 100"
    ttft, gap = figures["ttft_s"], figures["inter_token_s"]
    assert 0 < ttft["p50"] <= ttft["p99"] <= ttft["max"] < figures["wall_s"]
    assert 0 < gap["p50"] <= gap["p99"] < 30
    assert figures["tokens_per_s"] == pytest.approx(figures["tokens"] / figures["wall_s"])
    # The table's run: its shape only (the cluster is warm from the run above).
    table = run_cli("bench", str(smollm_cluster.config), "--streams", "1", "--tokens", "2",
                    "--prompt-tokens", "16", "--no-warmup", env=KEY_ENV, timeout=300)
    assert table.returncode == 0 and "TTFT" in table.stdout and "tokens/s" in table.stdout


@pytest.mark.e2e
def test_agents_and_ranks_get_no_secrets(smollm_cluster: Cluster) -> None:
    """The API key and HF_TOKEN in the orchestrator's environment reach no agent and no
    rank (/proc/<pid>/environ); what a rank needs does."""
    head = psutil.Process(smollm_cluster.orchestrator.process.pid)
    processes = head.children(recursive=True)
    agents = [p for p in processes if "node_agent" in p.cmdline()]
    ranks = [p for p in processes if "serving" in p.cmdline()]  # standby ranks too
    assert len(agents) == 2 and len(ranks) >= 2, [p.cmdline() for p in processes]
    for process in agents + ranks:
        raw = Path(f"/proc/{process.pid}/environ").read_bytes()
        names = {entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry}
        assert not {"TEST_ORCHESTRATOR_KEY", "HF_TOKEN"} & names, process.cmdline()
        assert API_KEY.encode() not in raw and HF_TOKEN.encode() not in raw
        assert {"PATH", "HOME"} <= names
    assert all(  # what the launch sets still arrives
        rank_env.LAUNCH_ID in Path(f"/proc/{rank.pid}/environ").read_text() for rank in ranks
    )


@pytest.mark.e2e
def test_second_up_is_refused(smollm_cluster: Cluster) -> None:
    """A second `up` of the same cluster refuses to start and names the running one."""
    result = run_cli("up", str(smollm_cluster.config), env=KEY_ENV)
    assert result.returncode == 2
    assert "already run by orchestrator pid" in result.stderr + result.stdout


@pytest.mark.e2e
def test_down_leaves_nothing(smollm_cluster: Cluster) -> None:
    """`down` stops the orchestrator gracefully; no process of the cluster is left (runs last).
    (Its drain: test_gateway_requests.py, on a cluster that answers faster.)"""
    pids = smollm_cluster.orchestrator.remember_descendants() | {
        smollm_cluster.orchestrator.process.pid
    }
    assert len(pids) >= 5  # orchestrator, 2 agents, 2 ranks
    result = run_cli("down", str(smollm_cluster.config))
    assert result.returncode == 0, result.stderr
    assert smollm_cluster.orchestrator.wait_exit() == 0
    assert wait_gone(pids) == set()
    status = run_cli("status", str(smollm_cluster.config), "--json")
    assert status.returncode == 2 and json.loads(status.stdout)["state"] == "not_running"


@pytest.mark.e2e
def test_preflight_failure_launches_nothing(tmp_path: Path, bundled_model_dir: Path) -> None:
    """SmolLM2 on 2 ranks in tensor mode (auto would pipeline it) fails preflight: exit 2,
    the heads message, no rank started."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", LOCAL3[:2],
                           cluster={"parallel": "tensor"})
    orchestrator = Orchestrator(config)
    try:
        assert orchestrator.wait_exit(180) == 2
    finally:
        orchestrator.stop()
    assert "[heads]" in orchestrator.text and "use 1 or 3 nodes" in orchestrator.text
    assert "rank 0 started" not in orchestrator.text


@pytest.mark.e2e
def test_taken_port_fails_preflight(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A gateway port already in use is reported by preflight, exit 2."""
    import socket

    config = write_cluster(tmp_path, str(tiny_model_dir), LOCAL3[:1])
    port = int(_api_url(config).rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        orchestrator = Orchestrator(config)
        try:
            assert orchestrator.wait_exit(180) == 2
        finally:
            orchestrator.stop()
    assert f"127.0.0.1:{port} (api.port) is already in use" in orchestrator.text


@pytest.mark.e2e
def test_a_failed_up_leaves_the_orphaned_gang_adoptable(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """After kill -9, an `up` that exits early (its API port taken) keeps the previous run's
    state file and launch secret: the next `up` adopts the gang, no relaunch."""
    import socket

    from orchestrator.launch import launch_secret

    config = write_cluster(tmp_path, str(tiny_model_dir), LOCAL3[:1],
                           supervisor={"orphan_grace_s": 60.0, "standby_ranks": False})
    url = _api_url(config)
    state, secret = tmp_path / "state" / "test.toml", launch_secret.secret_path(
        tmp_path / "state", "test")
    first = Orchestrator(config)
    pids: set[int] = set()
    try:
        first.wait_ready(url)
        pids = first.remember_descendants()
        first.process.kill()
        first.wait_exit()
        kept = state.read_bytes(), secret.read_bytes()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            squatter.listen()
            failed = run_cli("up", str(config))
        assert failed.returncode == 2, failed.stderr
        assert "(api.port) is already in use" in failed.stderr
        assert (state.read_bytes(), secret.read_bytes()) == kept
        with running(config, url=url) as second:
            assert "adopted launch" in second.text, second.text
            assert "rank 0 started" not in second.text
    finally:
        first.stop()
        kill_all(pids)


@pytest.mark.e2e
def test_orchestrator_sigkill_then_clean_up(tmp_path: Path, tiny_model_dir: Path) -> None:
    """With orphan_grace_s = 0, SIGKILL of the orchestrator takes agents and ranks down; a
    new `up` first ends a rank its state file still records as running, then starts cleanly.
    (One node: its agent and rank show the mechanism; two would cost two more rank starts.)"""
    config = write_cluster(tmp_path, str(tiny_model_dir), LOCAL3[:1],
                           supervisor={"orphan_grace_s": 0.0, **NO_STANDBY})
    url = _api_url(config)
    with running(config, url=url) as first:
        pids = first.remember_descendants()
        assert len(pids) >= 2, pids  # the agent and its rank at least
        first.process.kill()
        first.wait_exit()
        assert wait_gone(pids) == set(), "ranks or agents outlived a SIGKILLed orchestrator"
    path = tmp_path / "state" / "test.toml"
    state = read_state(path)
    assert state is not None and state.ranks, "the SIGKILLed run left no state file"
    # Here ranks die with their agent; on a machine that crashed with the orchestrator one
    # may live on: stand one in for it, recorded as the crashed run recorded its ranks.
    with leftover_rank(state.launch_id) as rank:
        state.ranks.append(RankRecord(rank=9, node="r0", pid=rank.pid, launch_id=state.launch_id))
        write_state(path, state)
        with running(config, url=url) as second:
            models = httpx.get(f"{url}/v1/models", timeout=30).json()
            assert models["data"][0]["id"] == tiny_model_dir.name
            assert "already run by" not in second.text
            assert rank.wait(10) is not None and "ended rank 9" in second.text


def test_down_ends_the_ranks_a_crashed_run_left(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The state file names an orchestrator that is gone and a rank still running (its
    launch id in its environment): `down` ends it through its node's agent, leaves a process
    of another launch alone, and removes the state file."""
    config = write_cluster(tmp_path, str(tiny_model_dir), LOCAL3[:2])
    gone = subprocess.Popen(["true"])
    gone.wait()
    path = tmp_path / "state" / "test.toml"
    with leftover_rank("crashed-1") as rank, leftover_rank("another-2") as stranger:
        records = [RankRecord(rank=0, node="r0", pid=rank.pid, launch_id="crashed-1"),
                   RankRecord(rank=1, node="r1", pid=stranger.pid, launch_id="crashed-1")]
        write_state(path, ClusterState(
            cluster="test", config=str(config), orchestrator_pid=gone.pid,
            orchestrator_started=0.0, api_url="http://127.0.0.1:9", launch_id="crashed-1",
            ranks=records,
        ))
        result = run_cli("down", str(config))
        assert result.returncode == 0, result.stdout + result.stderr
        assert rank.wait(10) is not None and stranger.poll() is None
        assert not path.exists()


@contextlib.contextmanager
def leftover_rank(launch_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process carrying a launch id in its environment, as ranks do; killed by PID at the
    end, whatever happens."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, rank_env.LAUNCH_ID: launch_id}, start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.e2e
@pytest.mark.alone
def test_a_request_through_the_gateway_wakes_idle_workers(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Idle workers sleep until just before each keepalive. A request sent to rank 0
    directly mid-sleep waits for the sleep's end; one through the gateway does not: the
    agents signal the workers as the gateway forwards it (serving/rank/idle_wake.py)."""
    config = write_cluster(tmp_path, str(tiny_model_dir), LOCAL3[:2], serving={"keepalive_s": 2.0},
                           supervisor=NO_STANDBY)
    url = _api_url(config)
    import tomllib

    direct = f"http://127.0.0.1:{tomllib.loads(config.read_text())['serving']['rank_api_port']}"
    body = {"model": tiny_model_dir.name, "prompt": "Hello", "max_tokens": 1}

    def after_idle(base: str, headers: dict[str, str]) -> float:
        def send() -> None:
            reply = httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=60)
            reply.raise_for_status()

        send()
        time.sleep(2.5)  # keepalive at 2.0 s, then the workers sleep until ~4.0 s
        started = time.monotonic()
        send()
        return time.monotonic() - started

    with running(config, url=url):
        # Each try costs a keepalive and a sleep (~3.5 s); the sleep's end is deterministic.
        slept = [after_idle(direct, rank0_headers(config))]
        woken = [after_idle(url, {}) for _ in range(2)]
    assert min(slept) > 0.8, slept  # the sleep is real: the test can tell
    assert max(woken) < 0.5, woken


def test_dry_run_prints_plan(tmp_path: Path) -> None:
    """`up --dry-run` prints the resolved plan as TOML and starts nothing."""
    config = write_cluster(tmp_path, "bundled:smollm2-135m-instruct", LOCAL3)
    result = run_cli("up", "--dry-run", str(config))
    assert result.returncode == 0, result.stderr
    import tomllib

    plan = tomllib.loads(result.stdout)
    assert [rank["env"]["MLX_RANK"] for rank in plan["ranks"]] == ["0", "1", "2"]
    assert json.loads(plan["ranks"][0]["files"]["hostfile.json"])[2][0].startswith("127.0.0.1:")


@pytest.mark.e2e
def test_two_ssh_nodes_up_chat_down(sshd: SshdServer, tmp_path: Path, tiny_model_dir: Path) -> None:
    """Two nodes reached through two real sshd servers run 2 ranks of the test model."""
    (tmp_path / "second-sshd").mkdir()
    with run_sshd(tmp_path / "second-sshd") as second:
        nodes = [
            {**msgspec.to_builtins(server.node(name)), "ip": "127.0.0.1"}
            for name, server in (("ssh-a", sshd), ("ssh-b", second))
        ]
        config = write_cluster(tmp_path, str(tiny_model_dir), nodes, supervisor=NO_STANDBY)
        url = _api_url(config)
        with running(config, url=url) as orchestrator:
            reply = httpx.post(
                f"{url}/v1/completions",
                timeout=120,
                json={
                    "model": tiny_model_dir.name,
                    "prompt": "Hello",
                    "max_tokens": 4,
                    "temperature": 0,
                },
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 4
            status = json.loads(run_cli("status", str(config), "--json").stdout)
            assert [rank["node"] for rank in status["ranks"]] == ["ssh-a", "ssh-b"]
            assert len(launch_processes(status["launch_id"])) == 2
            assert run_cli("down", str(config)).returncode == 0
            assert orchestrator.wait_exit() == 0
        # The ranks ran under the sshd servers, not under the orchestrator: look them up by launch.
        assert wait_no_launch(status["launch_id"]) == []
