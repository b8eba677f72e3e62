"""Requests that arrive together start together: four streamed chats that reach rank 0
at once are admitted by one plan, so every step of theirs decodes all four (rank 0's
serving_batch_size_steps) and their first tokens come out of the same step; and an idle
engine's arrival window lets a request sent a little later join the same first step."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from contract.rank_env import FORCED_OUTPUT
from orchestrator.loadgen.streams import StreamTimes, chat_body, stream_chat
from serving.engine.arrivals import WINDOW_S
from serving.model.bundled import default_cache_dir
from testkit.rank_cluster import rank_cluster
from testkit.tiny_model import write_tiny_model
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e
N, MAX_TOKENS = 4, 3


def histogram(url: str, most: int = 2) -> tuple[float, float]:
    """(steps that decoded at most `most` sequences, all steps that decoded any)."""
    return (metric_value(url, f'serving_batch_size_steps_bucket{{le="{most:.1f}"}}'),
            metric_value(url, "serving_batch_size_steps_count"))


@pytest.mark.alone  # a plan waits 50 ms at most: another test's ranks can outlast that
@pytest.mark.parametrize("ranks", [1, 2])
def test_requests_sent_together_are_decoded_together(
    tmp_path: Path, tiny_model_dir: Path, ranks: int
) -> None:
    """Rank 0 is stopped (SIGSTOP) while four clients send, so all four requests wait in
    its sockets, then continued: its handlers hand them over one after another, and the
    engine, woken by the first, must admit all four in one plan. Forced output (the same
    tokens, then EOS) makes them equally long, so no step may decode fewer than four:
    a request admitted a step early would decode its first token alone."""
    with rank_cluster(tmp_path, tiny_model_dir, ranks, served_model_id="m",
                      max_batch_size=8, env={FORCED_OUTPUT: "one two three four five"}) as c:
        url, rank0 = c.base_url, c.procs[0].pid
        clients = [httpx.Client(timeout=120) for _ in range(N)]
        with contextlib.ExitStack() as stack:
            for client in clients:
                stack.enter_context(client)
                client.get(f"{url}/v1/models").raise_for_status()  # connected before
            stream_chat(clients[0], url, chat_body("m", "warm up", MAX_TOKENS))
            # Its last step is counted after its last token is sent: wait for the count.
            wait_until(lambda: metric_value(url, "serving_requests_running") == 0, 30,
                       "the warm-up request's last step counted")
            before = histogram(url)
            results: list[StreamTimes] = []
            os.kill(rank0, signal.SIGSTOP)
            try:
                threads = [threading.Thread(target=lambda i=i: results.append(stream_chat(
                    clients[i], url, chat_body("m", f"Request {i} of {N}.", MAX_TOKENS))))
                    for i in range(N)]
                for thread in threads:
                    thread.start()
                time.sleep(0.5)  # every request sent into rank 0's sockets
            finally:
                os.kill(rank0, signal.SIGCONT)
            for thread in threads:
                thread.join(120)
        assert [r.error for r in results] == [""] * N
        assert all(r.completion_tokens in (None, MAX_TOKENS) for r in results)
        small, steps = (a - b for a, b in zip(histogram(url), before, strict=True))
        assert steps >= MAX_TOKENS and small == 0, (
            f"{small} of {steps} steps decoded at most 2 of the {N} requests sent together")


# Loop hops alone merge requests ~3 ms apart: the pair is sent further apart than that,
# well inside the 20 ms window a decode step of >= 0.13 s gives (160 layers here: 0.15 to
# 0.25 s a step), and a control pair well past both the window and the 50 ms a plan is held.
INSIDE_S, PAST_S = 0.010, 0.120


def lone_steps(url: str, client: httpx.Client, spacing_s: float) -> float:
    """Two equally long streamed chats sent `spacing_s` apart to an idle rank 0; returns
    the steps that decoded one of them alone (0 when both joined the same first step)."""
    wait_until(lambda: metric_value(url, "serving_requests_running") == 0, 30, "rank 0 idle")
    before = histogram(url, most=1)
    results: list[StreamTimes] = []

    def send(i: int) -> None:
        results.append(stream_chat(client, url, chat_body("m", f"Request {i}.", MAX_TOKENS)))

    first = threading.Thread(target=send, args=(0,))
    first.start()
    time.sleep(spacing_s)
    send(1)
    first.join(120)
    assert [r.error for r in results] == ["", ""]
    wait_until(lambda: metric_value(url, "serving_requests_running") == 0, 30, "both counted")
    alone, _ = (a - b for a, b in zip(histogram(url, most=1), before, strict=True))
    return alone


@pytest.mark.alone  # a pair 10 ms apart must reach rank 0 about 10 ms apart
def test_an_idle_engine_waits_for_a_request_sent_a_little_later(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """A 160-layer tiny model makes a decode step long, so the idle arrival window is its
    20 ms maximum: a request sent 10 ms after another (further apart than the loop's hops
    merge) is admitted by the same plan, so no step decodes either alone; a pair sent
    120 ms apart (past the window) is not, which shows the count can see a missed plan."""
    model = write_tiny_model(tmp_path / "deep", num_layers=160, model_cache_dir=default_cache_dir())
    with rank_cluster(tmp_path / "run", model, 1, served_model_id="m", max_batch_size=8,
                      env={FORCED_OUTPUT: "one two three four five"}) as c, \
            httpx.Client(timeout=120) as client:
        url = c.base_url
        # The window is a share of a measured decode-only step: the warm-up measures one.
        stream_chat(client, url, chat_body("m", "warm up", MAX_TOKENS))
        inside = [lone_steps(url, client, INSIDE_S) for _ in range(2)]
        past = lone_steps(url, client, PAST_S)
    assert WINDOW_S[1] > 1.5 * INSIDE_S
    assert inside == [0, 0], f"steps decoding one request alone, pairs 10 ms apart: {inside}"
    assert past > 0, "a pair 120 ms apart shared every step: the count cannot see a miss"
