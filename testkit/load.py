"""A steady request load on a cluster, and a link fault timed against it.

`Load` sends completions (streaming and not, alternately) in a thread and records how
each ended. `fault()` applies a fault under that load, reverts it after a while and
times what the cluster does: when /health left ready (the supervisor noticed), when it
was ready again, and when a request succeeded again. Tests assert on the outcome; the
benchmark (bench/link_faults.py) reports the times. `stream_token_times` records when
each chunk of one long stream arrives (inter-token latency under a long prefill).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

HUNG_AFTER_S = 5.0  # past the request timeout: a request this late counts as hung


@dataclass
class Outcome:
    started: float
    ended: float
    result: str  # "ok", "sse_error:<code>", "http_<status>:<code>", "exception:<type>"


class Load:
    """One client thread sending small completions back to back until stopped."""

    def __init__(self, url: str, model: str, request_timeout_s: float) -> None:
        self.url, self.model = url, model
        self.timeout_s = request_timeout_s + HUNG_AFTER_S
        self.request_timeout_s = request_timeout_s
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            stream = False
            while not self._stop.is_set():
                started = time.monotonic()
                result = self._one(client, stream)
                self.outcomes.append(Outcome(started, time.monotonic(), result))
                stream = not stream
                if result != "ok":
                    time.sleep(0.2)

    def _one(self, client: httpx.Client, stream: bool) -> str:
        body = {"model": self.model, "prompt": "Hello", "max_tokens": 8, "temperature": 0,
                "stream": stream}
        try:
            with client.stream("POST", f"{self.url}/v1/completions", json=body) as reply:
                text = reply.read().decode(errors="replace")
                if reply.status_code != 200:
                    return f"http_{reply.status_code}:{_code(text)}"
        except httpx.HTTPError as exc:
            return f"exception:{type(exc).__name__}"
        if stream and '"error"' in text:
            return f"sse_error:{_code(text)}"
        return "ok"

    def between(self, start: float, end: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.started < end and o.ended > start]

    def hung(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ended - o.started > self.request_timeout_s + 1]


def stream_token_times(url: str, arrivals: list[float], stop: threading.Event) -> None:
    """Stream a long completion from model "m", appending each chunk's arrival time
    (time.monotonic) to `arrivals`, until `stop` is set (hanging up cancels it)."""
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 4000, "stream": True,
            "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=1800) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
            if stop.is_set():
                return


def _code(text: str) -> str:
    marker = '"code":"'
    at = text.find(marker)
    return text[at + len(marker):].split('"', 1)[0] if at >= 0 else "?"


@dataclass
class FaultTimes:
    applied: float
    reverted: float
    left_ready: float | None = None  # /health stopped answering 200
    ready_again: float | None = None  # /health 200 after the revert
    served_again: float | None = None  # a request succeeded after the revert

    @property
    def detected_s(self) -> float | None:
        return None if self.left_ready is None else self.left_ready - self.applied

    @property
    def serving_again_s(self) -> float | None:
        return None if self.served_again is None else self.served_again - self.reverted


def fault(
    url: str,
    load: Load,
    apply: Callable[[], None],
    revert: Callable[[], None],
    hold_s: float,
    settle_s: float = 60.0,
    until: Callable[[], bool] | None = None,
) -> FaultTimes:
    """Apply, hold for hold_s while watching /health (or, with `until`, until it holds,
    asked every 0.5 s once /health left ready; at most hold_s), revert, wait until served
    again."""
    times = FaultTimes(applied=time.monotonic(), reverted=0.0)
    apply()
    asked = 0.0
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < times.applied + hold_s:
            if times.left_ready is None and not _ready(client, url):
                times.left_ready = time.monotonic()
            due = times.left_ready is not None and time.monotonic() - asked >= 0.5
            if until is not None and due:
                asked = time.monotonic()
                if until():
                    break
            time.sleep(0.1)
        revert()
        times.reverted = time.monotonic()
        deadline = times.reverted + settle_s
        while time.monotonic() < deadline and times.served_again is None:
            if times.ready_again is None and _ready(client, url):
                times.ready_again = time.monotonic()
            done = [o for o in load.outcomes if o.started > times.reverted and o.result == "ok"]
            if done:
                times.served_again = min(o.ended for o in done)
            time.sleep(0.1)
    return times


def _ready(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False
