"""Requests that arrive together start together: the engine's gather through the API's
event loop (serving/engine/arrivals.py), with a real loop and counted submissions."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.engine.arrivals import MAX_WAIT_S, WINDOW_S, arrival_window_s, gather


class Submissions:
    """What the engine sees: requests submitted so far; handlers that submit later."""

    def __init__(self) -> None:
        self.count = 0

    async def handler(self, turns: int) -> None:
        for _ in range(turns):  # a handler awaits a few times (body, render) before submit
            await asyncio.sleep(0)
        self.count += 1


async def test_handlers_ready_on_the_loop_all_submit_before_the_gather_ends() -> None:
    subs = Submissions()
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(subs.handler(turns)) for turns in (0, 1, 2)]
    hops = await asyncio.to_thread(gather, lambda: subs.count, lambda: 8, loop)
    assert subs.count == 3 and hops >= 3
    await asyncio.gather(*tasks)


async def test_an_idle_window_waits_for_a_request_read_a_little_later() -> None:
    """Without the window a request read later misses the plan; with it, it joins.
    (Margins of 10x: the gather's hops take milliseconds, the late one comes at 50 ms.)"""
    loop = asyncio.get_running_loop()
    for window_s, late_s, expected in ((0.0, 0.5, 1), (0.5, 0.05, 2)):
        subs = Submissions()
        subs.count = 1  # the request that woke the engine
        late = loop.call_later(late_s, lambda s=subs: setattr(s, "count", s.count + 1))
        await asyncio.to_thread(gather, lambda s=subs: s.count, lambda: 8, loop,
                                window_s=window_s, max_wait_s=1.0)
        assert subs.count == expected
        late.cancel()


async def test_a_full_batch_is_not_held_and_a_steady_stream_is_held_at_most_max_wait() -> None:
    loop = asyncio.get_running_loop()
    hops = await asyncio.to_thread(gather, lambda: 4, lambda: 4, loop, window_s=0.02)
    assert hops == 0
    subs = Submissions()
    stop = asyncio.Event()

    async def flood() -> None:
        while not stop.is_set():
            subs.count += 1
            await asyncio.sleep(0.001)

    flooding = asyncio.ensure_future(flood())
    began = time.monotonic()
    await asyncio.to_thread(gather, lambda: subs.count, lambda: 10**9, loop, window_s=0.02)
    took = time.monotonic() - began
    stop.set()
    await flooding
    assert took < MAX_WAIT_S + 0.05


def test_the_window_is_a_share_of_a_decode_step_within_bounds() -> None:
    low, high = WINDOW_S
    assert arrival_window_s(None) == low
    assert arrival_window_s(0.0) == low
    assert low < arrival_window_s(0.07) < high
    assert arrival_window_s(10.0) == high


def test_the_window_is_15_percent_of_a_step_from_1_to_20_ms() -> None:
    """The documented figures: 15% of a decode step, 1 to 20 ms, a plan held <= 50 ms."""
    assert arrival_window_s(0.1) == pytest.approx(0.015)
    assert arrival_window_s(None) == pytest.approx(0.001)
    assert arrival_window_s(0.002) == pytest.approx(0.001)
    assert arrival_window_s(1.0) == pytest.approx(0.02)
    assert MAX_WAIT_S <= 0.05  # the most a plan is held, window or not
