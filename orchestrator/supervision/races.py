"""Waiting for the first of several things, the rest cancelled: a watch against an agent's
report and a stop request, a backoff against a stop request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def first_done(*waits: Awaitable[object]) -> None:
    """Return once any of `waits` is done; the others are cancelled (also when the caller
    is). A done one keeps its result or exception for whoever holds it."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
