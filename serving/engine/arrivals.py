"""Requests that arrive together start together: let the API's event loop finish handing
over the requests it already holds before the engine admits any.

Rank 0's handlers render and tokenize each prompt on the event loop, one after another
(several ms each on a loaded 2-core box), while the engine thread wakes on the first
submit. Admitting at once put the first of four simultaneous requests in a step of its
own and the other three one or two steps later: their first tokens waited for the first
one's prefill (measured: 4 arrivals, TTFT 2x mlx_lm.server's). So before a plan admits
newly waiting requests, the engine sends a no-op callback round trip through the loop:
the loop runs callbacks in order, so the hop returns only after the handlers that were
ready before it have run (and submitted). It hops again while hops bring new requests,
until `quiet_hops` hops in a row bring none, the batch is full, or `max_wait_s` passed.
When nothing is running, it also waits out a short arrival window (below): requests a
client sends together reach the server a few ms apart. While streams decode it does
not: holding the plan would hold their next token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

QUIET_HOPS = 3  # a handler may take a few loop turns (body, then render) before it submits
MAX_WAIT_S = 0.05  # never hold a plan longer for stragglers
NAP_S = 0.001  # between hops while an idle engine waits out its arrival window
# An idle engine also waits until no request came for this share of a decode step: a
# lone request's first token takes >= 3 steps (prefill, mlx-lm's split, the token), so
# it pays under 5% of its TTFT; a burst whose first request was read a few ms ahead of
# the rest (8 client threads here: 7 ms) saves that request's prefill step (~120 ms).
WINDOW_SHARE = 0.15
WINDOW_S = (0.001, 0.02)  # bounds; the lower one also before any step was measured


def arrival_window_s(decode_step_s: float | None) -> float:
    """How long an idle engine waits for a request's companions to arrive."""
    low, high = WINDOW_S
    return low if decode_step_s is None else min(max(WINDOW_SHARE * decode_step_s, low), high)


def loop_hop(loop: asyncio.AbstractEventLoop, timeout_s: float) -> bool:
    """Wait until `loop` has run every callback queued before this call; False on timeout
    or a closed loop."""
    done = threading.Event()
    try:
        loop.call_soon_threadsafe(done.set)
    except RuntimeError:  # the loop has closed: nobody will submit anything more
        return False
    return done.wait(timeout_s)


def gather(
    waiting: Callable[[], int],
    room: Callable[[], int],
    loop: asyncio.AbstractEventLoop,
    *,
    window_s: float = 0.0,
    quiet_hops: int = QUIET_HOPS,
    max_wait_s: float = MAX_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    nap: Callable[[float], None] = time.sleep,
) -> int:
    """Hop through `loop` until it has handed over what it holds and, with `window_s`,
    until no request came for that long; returns the hops made.

    `waiting()` counts the requests submitted and not yet admitted, `room()` how many the
    next plan can still admit."""
    deadline = clock() + max_wait_s
    hops = quiet = 0
    seen, last_new = waiting(), clock()
    while seen < room():
        now = clock()
        if quiet >= quiet_hops:
            rest = min(last_new + window_s, deadline) - now
            if rest <= 0:
                break
            nap(min(rest, NAP_S))
        if not loop_hop(loop, max(deadline - clock(), 0.0)):
            break
        hops += 1
        count = waiting()
        quiet, last_new = (0, clock()) if count > seen else (quiet + 1, last_new)
        seen = count
    return hops
