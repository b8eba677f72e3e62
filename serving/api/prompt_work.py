"""Rendering and tokenizing a prompt, off the event loop and only when it can be admitted.

A prompt may be megabytes (max_body_bytes): its chat template and tokenizer take tens of
milliseconds to seconds, which on the event loop would stall every other request and
/health. So the work runs in one thread of its own (the tokenizer's Rust core is not
meant to be driven from several at once), and is refused (429) before it starts when
the engine's waiting queue is already full or MAX_PREPARING prompts are already in line
for that thread: the work a client can make rank 0 do before admission is bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from serving.api.errors import queue_full
from serving.engine.engine import Engine

T = TypeVar("T")
MAX_PREPARING = 8  # prompts being tokenized or waiting for the tokenizer thread


class PromptWork:
    """The tokenizer thread and its bound."""

    def __init__(self, limit: int = MAX_PREPARING) -> None:
        self.limit = limit
        self.preparing = 0  # changed on the event loop only
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run(self, engine: Engine, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` in the tokenizer thread; 429 first if it could not be admitted."""
        if engine.queue_is_full():
            raise queue_full(f"Too many requests waiting: {engine.queue_limit} already waiting")
        if self.preparing >= self.limit:
            raise queue_full(f"Too many prompts being prepared: {self.limit} already")
        self.preparing += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._thread(), partial(work, *args))
        finally:
            self.preparing -= 1

    def _thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
            return self._executor
