"""Helpers for the serving tests: reading /metrics and waiting for a condition."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from testkit.http_tls import default_tls


def metric_value(base_url: str, name: str, verify: Any = True) -> float:
    """The sum of a metric's samples named exactly `name` (any labels) from /metrics
    (`verify`: httpx's, e.g. a context pinned to rank 0's certificate)."""
    verify = default_tls() if verify is True else verify  # not a new CA load per poll
    text = httpx.get(f"{base_url}/metrics", timeout=10, verify=verify).text
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it holds; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


HEALTH_POLL_S = 0.1  # every cluster a test starts waits half of it on average, past ready


def wait_healthy(url: str, timeout_s: float, check_alive: Callable[[], None]) -> bool:
    """Until `url`/health answers 200 (True) or `timeout_s` passed (False). One client for
    every ask (a poll then costs ~1 ms of CPU, not a CA load); `check_alive()` runs before
    each and raises when what should answer has exited."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return True
            time.sleep(HEALTH_POLL_S)
    return False
