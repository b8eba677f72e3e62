"""Rank 0's engine over a fake batch: admission, continuous batching, cancel, stop strings,
limits and shutdown, with no model and no MLX."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace

import pytest

from contract.kv_cache import KvLayout
from contract.model_config import config_info
from serving.engine.batch import TokenEvent
from serving.engine.engine import Engine, EngineStopping, QueueFull
from serving.engine.kv_budget import BeyondBudget, KvBudget
from serving.engine.prefill_pacing import PrefillPacer
from serving.engine.requests import EventSink, Failed, Finished, GenerationRequest, TextDelta
from serving.engine.step_plan import Insert, SamplingParams
from serving.faults import FaultPlan
from serving.metrics import ServingMetrics


class FakeBatch:
    """Every sequence emits token 1, 2, 3 ... one per step, until its max_tokens."""

    def __init__(self, step_s: float = 0.0, kv: KvBudget | None = None) -> None:
        self.step_s = step_s
        self.kv = kv
        self.peak = 0  # the most sequences live at once
        self.cached_tokens = 0
        self.cache_hits = 0
        self.prompt_cache_bytes = 0
        self.applied: list[tuple[list[str], list[int]]] = []  # (inserted request ids, removes)
        self._next_uid = 0
        self._live: dict[int, list[int]] = {}  # uid -> [tokens so far, max_tokens]

    def fingerprint(self, perturb: bool = False) -> int:
        return hash(tuple(self._live))

    def apply(self, inserts: list[Insert], removes: list[int]) -> list[int]:
        self.applied.append(([i.request_id for i in inserts], list(removes)))
        for uid in removes:
            self._live.pop(uid, None)
        uids = []
        for insert in inserts:
            uids.append(self._next_uid)
            self._live[self._next_uid] = [0, insert.params.max_tokens]
            self._next_uid += 1
        self.peak = max(self.peak, len(self._live))
        return uids

    @contextlib.contextmanager
    def stats(self) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(prompt_tokens=0, prompt_time=0.0)

    def step(self, prefill_chunk: int = 0) -> list[TokenEvent]:
        if self._live:  # as mlx-lm's: a step with no sequence returns at once
            time.sleep(self.step_s)
        events = []
        for uid, state in list(self._live.items()):
            state[0] += 1
            done = state[0] >= state[1]
            events.append(TokenEvent(uid, state[0], "length" if done else None))
            if done:
                del self._live[uid]
        return events


class Detokenizer:
    def __init__(self) -> None:
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self.last_segment = f"<{token}>"

    def finalize(self) -> None:
        self.last_segment = ""


class Tokenizer:
    @property
    def detokenizer(self) -> Detokenizer:
        return Detokenizer()


class Running:
    def __init__(self, batch: FakeBatch, **limits: int) -> None:
        self.batch = batch
        self.pacer = PrefillPacer(512, 0)
        self.engine = Engine(
            batch,  # type: ignore[arg-type]
            None,
            Tokenizer(),
            max_batch_size=limits.get("max_batch_size", 8),
            queue_limit=limits.get("queue_limit", 64),
            keepalive_s=0.02,
            faults=FaultPlan([], 0),
            metrics=ServingMetrics(),
            pacer=self.pacer,
        )
        self.thread = threading.Thread(target=self.engine.run, daemon=True)

    def submit(
        self, rid: str, max_tokens: int, stop: list[str] | None = None, timeout_s: float = 60.0
    ) -> EventSink:
        sink = EventSink(asyncio.get_running_loop())
        params = SamplingParams(0.0, 1.0, 0, max_tokens, 7)
        deadline = time.monotonic() + timeout_s
        request = GenerationRequest(rid, [5, 6, 7], params, stop or [], sink, deadline)
        self.engine.submit(request)
        return sink


@pytest.fixture
def engine() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for running in started:
        running.engine.begin_stop(0)
        running.thread.join(5)


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(300):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not {what}")


def inserted(running: Running) -> list[list[str]]:
    """The request ids of each apply() that inserted any, in order."""
    return [ids for ids, _ in running.batch.applied if ids]


def removed(running: Running) -> list[int]:
    return [uid for _, removes in running.batch.applied for uid in removes]


def start(
    started: list[Running], step_s: float = 0.0, run: bool = True, kv: KvBudget | None = None,
    **limits: int,
) -> Running:
    """A running engine; with run=False its thread is left to the test to start (requests
    submitted before are all there at its first admission)."""
    running = Running(FakeBatch(step_s, kv), **limits)
    if run:
        running.thread.start()
    started.append(running)
    return running


async def events(sink: EventSink) -> AsyncIterator[TextDelta | Finished | Failed]:
    while True:
        event = await asyncio.wait_for(sink.queue.get(), 5)
        yield event
        if not isinstance(event, TextDelta):
            return


async def collect(sink: EventSink) -> tuple[str, Finished | Failed]:
    text = []
    async for event in events(sink):
        if isinstance(event, TextDelta):
            text.append(event.text)
        else:
            return "".join(text), event
    raise AssertionError("no end event")


async def test_tokens_come_back_as_text_then_finished(engine: list[Running]) -> None:
    """A request gets one text delta per token, then Finished with its reason and counts."""
    running = start(engine)
    text, end = await collect(running.submit("r1", max_tokens=3))
    assert text == "<1><2><3>"
    assert end == Finished("length", 3, 3)


async def test_a_full_batch_admits_the_next_request_when_a_slot_frees(
    engine: list[Running],
) -> None:
    """max_batch_size 2: the third request waits, and joins once one of the first ends."""
    running = start(engine, step_s=0.002, run=False, max_batch_size=2)
    sinks = [running.submit("short", 2), running.submit("long", 6), running.submit("late", 2)]
    running.thread.start()
    results = [await collect(sink) for sink in sinks]
    assert [end.finish_reason for _, end in results] == ["length"] * 3  # type: ignore[union-attr]
    inserted = [ids for ids, _ in running.batch.applied if ids]
    assert inserted[0] == ["short", "long"] and ["late"] in inserted[1:]
    assert max(len(ids) for ids in inserted) <= 2


def two_sequence_budget() -> KvBudget:
    """128 bytes of KV per token (1 layer, 1 KV head of 64, 1-byte elements); a request
    of 3 prompt tokens + 10 max_tokens takes one 256-token step: 32 KiB. Room for two."""
    config = config_info({"num_hidden_layers": 1, "num_attention_heads": 1,
                          "hidden_size": 64})
    return KvBudget(config, [KvLayout(range(1), element_bytes=1)], [2 * 256 * 128])


async def test_the_kv_budget_holds_requests_in_the_queue(engine: list[Running]) -> None:
    """Room for two sequences, max_batch_size 8: four requests all finish, never more than
    two at once; one that cannot fit even alone is refused at submit, naming both figures."""
    running = start(engine, step_s=0.002, run=False, kv=two_sequence_budget())
    sinks = [running.submit(f"r{i}", 10) for i in range(4)]
    running.thread.start()
    results = [await collect(sink) for sink in sinks]
    assert [end.finish_reason for _, end in results] == ["length"] * 4  # type: ignore[union-attr]
    assert running.batch.peak == 2
    refused = r"needs 0\.13 MB .* 1003 tokens.* KV budget of 65536 bytes"
    with pytest.raises(BeyondBudget, match=refused):
        running.submit("huge", 1000)


async def test_a_cancelled_request_leaves_the_batch(engine: list[Running]) -> None:
    """cancel() removes the request's sequence from the batch within two steps."""
    running = start(engine, step_s=0.01)
    sink = running.submit("gone", max_tokens=10_000)
    await sink.queue.get()  # it runs
    steps_before = len(running.batch.applied)
    running.engine.cancel("gone")
    for _ in range(200):
        if any(removes == [0] for _, removes in running.batch.applied):
            break
        await asyncio.sleep(0.01)
    assert any(removes == [0] for _, removes in running.batch.applied)
    assert len(running.batch.applied) - steps_before <= 2


async def test_a_stop_string_ends_the_request_before_it(engine: list[Running]) -> None:
    """The text stops before the first stop string; finish_reason is stop; the sequence
    leaves the batch (it would otherwise run on to max_tokens)."""
    running = start(engine)
    text, end = await collect(running.submit("s", max_tokens=10, stop=["<3>"]))
    assert text == "<1><2>"
    assert isinstance(end, Finished) and end.finish_reason == "stop"
    await until(lambda: 0 in removed(running), "removed from the batch")


async def test_a_stop_string_across_tokens_is_never_partly_sent(engine: list[Running]) -> None:
    """Text that could begin a stop string is held back: the client never sees a part of it."""
    running = start(engine)
    text, end = await collect(running.submit("s", max_tokens=10, stop=["2><3"]))
    assert text == "<1><"
    assert isinstance(end, Finished) and (end.finish_reason, end.completion_tokens) == ("stop", 3)


async def test_a_cancelled_waiting_request_never_enters_the_batch(
    engine: list[Running],
) -> None:
    """cancel() of a request still waiting drops it from the queue: the next one is served."""
    running = start(engine, step_s=0.005, run=False, max_batch_size=1)
    first = running.submit("a", 3)
    running.submit("b", 3)
    running.engine.cancel("b")
    third = running.submit("c", 3)
    running.thread.start()
    assert (await collect(first))[1] == Finished("length", 3, 3)
    assert (await collect(third))[1] == Finished("length", 3, 3)
    assert inserted(running) == [["a"], ["c"]]


async def test_a_full_queue_refuses_with_queue_full(engine: list[Running]) -> None:
    """Past queue_limit waiting requests, submit raises QueueFull (the API's 429)."""
    running = start(engine, step_s=0.05, max_batch_size=1, queue_limit=1)
    running.submit("a", 10_000)
    for _ in range(100):  # until "a" runs and the queue is empty again
        if running.engine.pending == 1 and running.batch.applied:
            break
        await asyncio.sleep(0.01)
    running.submit("b", 2)
    with pytest.raises(QueueFull):
        running.submit("c", 2)


async def test_requests_a_free_slot_will_take_are_not_counted_as_queued() -> None:
    """Sent together to an idle engine (before it plans: the thread not started), as many
    requests as free slots, then `queue_limit` more, are taken; the next is refused."""
    running = Running(FakeBatch(), max_batch_size=2, queue_limit=1)
    for rid in ("a", "b", "c"):
        running.submit(rid, 2)
    with pytest.raises(QueueFull):
        running.submit("d", 2)


async def test_stopping_refuses_new_requests_and_ends_running_ones(
    engine: list[Running],
) -> None:
    """After begin_stop, submit raises EngineStopping; a running request fails with shutdown."""
    running = start(engine, step_s=0.01)
    sink = running.submit("busy", 10_000)
    await sink.queue.get()
    running.engine.begin_stop(0)
    _, end = await collect(sink)
    assert isinstance(end, Failed) and end.code == "shutdown"
    with pytest.raises(EngineStopping):
        running.submit("late", 2)


async def test_a_stop_with_grace_lets_running_requests_finish(engine: list[Running]) -> None:
    """begin_stop(grace): a request that ends within the grace finishes normally."""
    running = start(engine, step_s=0.01)
    sink = running.submit("short", 5)
    await sink.queue.get()
    running.engine.begin_stop(10.0)
    _, end = await collect(sink)
    assert end == Finished("length", 3, 5)


async def test_a_request_past_its_deadline_times_out(engine: list[Running]) -> None:
    """A request still running at its deadline ends with a timeout failure."""
    running = start(engine, step_s=0.01)
    _, end = await collect(running.submit("slow", 10_000, timeout_s=0.1))
    assert isinstance(end, Failed) and end.code == "timeout"


async def test_a_request_that_waits_past_its_deadline_times_out(engine: list[Running]) -> None:
    """A request still queued (the batch full) at its deadline fails with timeout, unserved."""
    running = start(engine, step_s=0.01, max_batch_size=1)
    running.submit("busy", 10_000)
    _, end = await collect(running.submit("queued", 2, timeout_s=0.1))
    assert end == Failed("request timed out while waiting", "timeout")
    assert inserted(running) == [["busy"]]


async def test_requests_that_arrive_together_join_the_same_step(engine: list[Running]) -> None:
    """Four handlers each render their prompt (blocking, as tokenizing does) and submit
    one after another on the loop while the engine, idle, wakes at the first: all four
    are inserted by one plan, not the first alone (serving/engine/arrivals.py)."""
    running = start(engine, step_s=0.01)
    await asyncio.sleep(0.05)  # idle

    async def handler(rid: str) -> EventSink:
        await asyncio.sleep(0)
        time.sleep(0.004)  # rendering and tokenizing the prompt
        return running.submit(rid, max_tokens=2)

    sinks = await asyncio.gather(*(handler(f"r{i}") for i in range(4)))
    for sink in sinks:
        await collect(sink)
    assert inserted(running)[0] == ["r0", "r1", "r2", "r3"]


async def test_an_idle_engine_waits_its_window_for_a_request_submitted_later(
    engine: list[Running],
) -> None:
    """Once a decode step was measured (0.14 s: the 20 ms window), a request submitted 6 ms
    after the one that woke the idle engine (here the loop's hops take microseconds) is
    inserted by the same plan (serving/engine/arrivals.py's arrival window). The empty step
    planned ahead of the warm-up's last token is not timed as a decode step: it would
    shrink the window (and the prefill pacer's budget) by 30% after every lone request."""
    running = start(engine, step_s=0.14)
    await collect(running.submit("warm-up", max_tokens=2))
    await asyncio.sleep(0.05)  # the step planned ahead of its last token: idle then
    assert running.pacer.decode_step_s is not None and running.pacer.decode_step_s > 0.13
    first = running.submit("a", max_tokens=1)
    await asyncio.sleep(0.006)
    second = running.submit("b", max_tokens=1)
    await collect(first)
    await collect(second)
    assert inserted(running)[1:] == [["a", "b"]]
