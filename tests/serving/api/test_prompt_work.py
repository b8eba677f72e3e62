"""Prompt work at rank 0 (fast, a stand-in engine): off the event loop, and refused before
it starts when the queue is full or too many prompts are already being prepared."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from contract.openai_errors import ApiError
from serving.api.prompt_work import PromptWork


class Queue:
    """The engine as PromptWork asks it: whether its waiting queue is full."""

    queue_limit = 4

    def __init__(self, full: bool = False) -> None:
        self.full = full

    def queue_is_full(self) -> bool:
        return self.full


def test_work_runs_off_the_loop_which_stays_responsive() -> None:
    """A 0.5 s tokenization runs in another thread; the loop ticks meanwhile."""

    def slow(text: str) -> list[int]:
        time.sleep(0.5)
        return [threading.get_ident(), len(text)]

    async def run() -> tuple[list[int], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        result = await PromptWork().run(Queue(), slow, "abc")  # type: ignore[arg-type]
        ticker.cancel()
        return result, ticks

    (thread, length), ticks = asyncio.run(run())
    assert thread != threading.get_ident() and length == 3
    assert ticks >= 20  # about 50 if the loop never waited on the work


def test_a_full_queue_refuses_before_the_work() -> None:
    """With the engine's queue full: 429 queue_full, and the prompt is never tokenized."""
    called: list[Any] = []
    with pytest.raises(ApiError) as refused:
        asyncio.run(PromptWork().run(Queue(full=True), called.append, "x"))  # type: ignore[arg-type]
    assert refused.value.status == 429 and refused.value.body.code == "queue_full"
    assert called == []


def test_prompts_being_prepared_are_bounded() -> None:
    """Beyond `limit` prompts in line for the tokenizer thread, the next is refused (429)."""
    release = threading.Event()

    async def run() -> list[str]:
        work = PromptWork(limit=2)
        queue: Any = Queue()
        held = [asyncio.ensure_future(work.run(queue, release.wait, 5.0)) for _ in range(2)]
        await asyncio.sleep(0.05)
        outcomes = []
        try:
            await work.run(queue, lambda: None)
        except ApiError as exc:
            outcomes.append(f"{exc.status} {exc.body.message}")
        release.set()
        await asyncio.gather(*held)
        await work.run(queue, lambda: None)  # a place again
        return outcomes

    assert asyncio.run(run()) == ["429 Too many prompts being prepared: 2 already"]
