"""Requests that arrive together start together: four streamed chats that reach rank 0
at once are admitted by one plan, so every step of theirs decodes all four (rank 0's
serving_batch_size_steps) and their first tokens come out of the same step."""

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
from testkit.rank_cluster import rank_cluster
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e
N, MAX_TOKENS = 4, 3


def histogram(url: str) -> tuple[float, float]:
    """(steps that decoded at most 2 sequences, all steps that decoded any)."""
    return (metric_value(url, 'serving_batch_size_steps_bucket{le="2.0"}'),
            metric_value(url, "serving_batch_size_steps_count"))


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
