"""Failure behaviour of real ranks: injected faults, lost peers, shutdown, exit codes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from contract.exit_codes import RankExit
from testkit.rank_cluster import rank_cluster
from testkit.tiny_model import write_tiny_model
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e


def fire_request(base_url: str, max_tokens: int = 8) -> threading.Thread:
    """Send a completion in the background (its outcome is not the point)."""

    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"{base_url}/v1/completions",
                timeout=120,
                json={"model": "m", "prompt": "Hello", "max_tokens": max_tokens},
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fault_env(spec: str) -> dict[str, str]:
    return {"ORCHESTRATOR_FAULT": spec}


@pytest.fixture(scope="module")
def three_way_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A tiny model that shards 3 ways (6 heads, 3 KV heads): a worker lost among 3 ranks
    at a step's cost of milliseconds, where 3 ranks of SmolLM2 on 2 cores take seconds.
    (tiny_model_dir: the bundled tokenizer, converted once.)"""
    return write_tiny_model(tmp_path_factory.mktemp("three-way") / "m", num_heads=6,
                            num_kv_heads=3, hidden_size=48)


def test_injected_desync_exits_worker_with_desync_code(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """desync on rank 1 at step 2: the plan for step 3 carries rank 0's batch after step
    2's plan; rank 1 logs BATCH DESYNC with both fingerprints and exits DESYNC."""
    with rank_cluster(
        tmp_path, tiny_model_dir, 2, env=fault_env("desync:rank=1:step=2"), served_model_id="m"
    ) as cluster:
        fire_request(cluster.base_url)
        assert cluster.wait_exit(1, 60) == RankExit.DESYNC
        log = cluster.log_text(1)
        assert "BATCH DESYNC at step 3: fingerprint after step 2's plan rank0=" in log
        assert " local=" in log
        assert cluster.wait_exit(0, 30) == RankExit.PEER_LOST


def test_killed_worker_makes_rank0_exit_peer_lost(tmp_path: Path, three_way_model: Path) -> None:
    """SIGKILL on an idle worker: rank 0 notices via keepalive and exits PEER_LOST within 5 s."""
    with rank_cluster(tmp_path, three_way_model, 3, served_model_id="m") as cluster:
        os.kill(cluster.procs[2].pid, signal.SIGKILL)
        assert cluster.wait_exit(0, 5) == RankExit.PEER_LOST
        assert "peer lost" in cluster.log_text(0)
        assert cluster.wait_exit(1, 10) == RankExit.PEER_LOST


def test_worker_killed_mid_step_ends_rank0_and_its_requests(
    tmp_path: Path, three_way_model: Path
) -> None:
    """SIGKILL on a worker while rank 0 waits inside a step's collective (the worker is
    held at step 4 first): MLX 0.32's ring fails that collective without releasing its
    waiter, yet rank 0 exits PEER_LOST within 5 s and the in-flight stream ends with an
    error event instead of a cut connection."""
    with rank_cluster(
        tmp_path, three_way_model, 3, served_model_id="m", env=fault_env("hang:rank=1:step=4")
    ) as cluster:
        body = {"model": "m", "prompt": "Tell a long story", "max_tokens": 50, "stream": True}
        with httpx.stream(
            "POST", f"{cluster.base_url}/v1/completions", json=body, timeout=60
        ) as response:
            lines = response.iter_lines()
            assert '"text"' in next(line for line in lines if line.startswith("data: "))
            wait_until(lambda: "[fault] hanging at step 4" in cluster.log_text(1), 30, "hang")
            os.kill(cluster.procs[1].pid, signal.SIGKILL)
            assert cluster.wait_exit(0, 5) == RankExit.PEER_LOST
            rest = list(lines)
        assert any('"engine_error"' in line for line in rest), rest[-5:]
        assert cluster.wait_exit(2, 10) == RankExit.PEER_LOST


def test_injected_exit_uses_the_given_code(tmp_path: Path, tiny_model_dir: Path) -> None:
    """exit:rank=1:step=2:code=42 ends rank 1 with 42 at step 2."""
    with rank_cluster(
        tmp_path,
        tiny_model_dir,
        2,
        served_model_id="m",
        env=fault_env("exit:rank=1:step=2:code=42"),
    ) as cluster:
        fire_request(cluster.base_url)
        assert cluster.wait_exit(1, 60) == 42
        assert cluster.wait_exit(0, 30) == RankExit.PEER_LOST


def test_hung_worker_leaves_rank0_api_responsive(tmp_path: Path, tiny_model_dir: Path) -> None:
    """hang on rank 1: rank 0 blocks in a collective, yet /health and /metrics still answer,
    showing pending work and no further step progress (what a watchdog needs)."""
    with rank_cluster(
        tmp_path, tiny_model_dir, 2, served_model_id="m", env=fault_env("hang:rank=1:step=3"),
        stop_grace=1.0,  # the hung rank ignores SIGTERM and rank 0 waits in a collective
    ) as cluster:
        fire_request(cluster.base_url, max_tokens=50)
        url = cluster.base_url
        wait_until(lambda: "[fault] hanging at step 3" in cluster.log_text(1), 60, "the hang")
        steps = metric_value(url, "serving_steps_total")
        for _ in range(5):
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
            assert metric_value(url, "serving_requests_pending") == 1
        assert metric_value(url, "serving_steps_total") == steps <= 3
        assert cluster.procs[0].poll() is None


def test_ebusy_and_exit_on_load_faults(tmp_path: Path, tiny_model_dir: Path) -> None:
    """ebusy prints a JACCL errno 16 line and exits DISTRIBUTED_INIT_FAILED; exit_on_load
    exits with its code before loading."""
    with rank_cluster(
        tmp_path / "a", tiny_model_dir, 1, wait=False, env=fault_env("ebusy:rank=0")
    ) as cluster:
        assert cluster.wait_exit(0, 60) == RankExit.DISTRIBUTED_INIT_FAILED
        assert "[jaccl]" in cluster.log_text(0) and "errno 16" in cluster.log_text(0)
    with rank_cluster(
        tmp_path / "b", tiny_model_dir, 2, wait=False, env=fault_env("exit_on_load:rank=1:code=33")
    ) as cluster:
        assert cluster.wait_exit(1, 60) == 33


def test_health_503_while_loading_then_sigterm(tmp_path: Path, tiny_model_dir: Path) -> None:
    """/health is 503 'loading' until every rank has loaded (rank 1 never does here);
    completions are refused meanwhile; SIGTERM while loading exits OK."""
    with rank_cluster(
        tmp_path,
        tiny_model_dir,
        2,
        wait=False,
        served_model_id="m",
        env=fault_env("hang_on_load:rank=1"),
    ) as cluster:
        url = cluster.base_url

        def loading() -> bool:
            try:
                r = httpx.get(f"{url}/health", timeout=2)
            except httpx.HTTPError:
                return False
            return r.status_code == 503 and r.json()["status"] == "loading"

        wait_until(loading, 60, "/health 503 while loading")
        assert loading()  # still: rank 0 waits in sharded_load's barrier for rank 1
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "service_unavailable"
        os.kill(cluster.procs[0].pid, signal.SIGTERM)
        assert cluster.wait_exit(0, 30) == RankExit.OK


def test_sigterm_stops_rank0_and_workers_cleanly(tmp_path: Path, tiny_model_dir: Path) -> None:
    """SIGTERM to rank 0: it sends a shutdown plan; every rank exits OK."""
    with rank_cluster(tmp_path, tiny_model_dir, 2, served_model_id="m") as cluster:
        r = httpx.post(
            f"{cluster.base_url}/v1/completions",
            timeout=120,
            json={"model": "m", "prompt": "Hi", "max_tokens": 4},
        )
        assert r.status_code == 200
        os.kill(cluster.procs[0].pid, signal.SIGTERM)
        assert [cluster.wait_exit(rank, 30) for rank in range(2)] == [RankExit.OK] * 2
        assert "shutdown plan received" in cluster.log_text(1)


@pytest.fixture
def limited(tmp_path: Path, bundled_model_dir: Path):  # type: ignore[no-untyped-def]
    with rank_cluster(
        tmp_path,
        bundled_model_dir,
        1,
        served_model_id="m",
        max_batch_size=1,
        queue_limit=1,
        request_timeout_s=3.0,
    ) as cluster:
        yield cluster


@pytest.mark.alone  # both requests must be seen pending within one 3 s request timeout
def test_queue_limit_429_and_request_timeout(limited) -> None:  # type: ignore[no-untyped-def]
    """With one slot and one waiting place, a third request gets 429 + Retry-After; a request
    running past request_timeout_s ends with a timeout error."""
    url = limited.base_url
    body = {"model": "m", "prompt": "Write a long story.", "max_tokens": 500, "temperature": 0}
    results: list[httpx.Response] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            )
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: metric_value(url, "serving_requests_pending") == 2, 30, "2 pending")
    except AssertionError as exc:  # say what the two got, if they were answered already
        answers = [(r.status_code, r.text[:200]) for r in results]
        raise AssertionError(f"{exc}; answered meanwhile: {answers}") from None
    third = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert third.status_code == 429 and third.headers["retry-after"]
    assert third.json()["error"]["type"] == "rate_limit_error"
    for t in threads:
        t.join(60)
    assert [r.status_code for r in results] == [504, 504]
    assert all(r.json()["error"]["code"] == "timeout" for r in results)
