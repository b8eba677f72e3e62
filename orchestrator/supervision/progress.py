"""Rank 0 seen from the control plane: ready or not, and whether its engine makes progress."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from contract import metric_names
from contract.metric_names import sample_name
from orchestrator.tls import pinned

POLL_S = 0.1  # a loopback or LAN GET: cheap, and it bounds how late ready is noticed


@dataclass
class ServingSample:
    steps: float = 0.0
    last_step_timestamp: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    generation_tokens: float = 0.0
    draft_tokens: float = 0.0  # speculative decoding: drafts verified, and kept
    accepted_tokens: float = 0.0
    ttft_p50_s: float | None = None  # from rank 0's histogram, over its whole life
    # The TTFT histogram itself, cumulative (upper bound, count): the page's charts take
    # quantiles over a recent window from the difference of two samples.
    ttft_buckets: list[tuple[float, float]] = field(default_factory=list)


class Rank0Probe:
    """Rank 0's /health and /metrics over HTTP, or HTTPS pinned to `tls_cert` when given."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._pinned: tuple[str, httpx.AsyncClient] | None = None  # the latest launch's

    async def _client(self, tls_cert: str) -> httpx.AsyncClient:
        if not tls_cert:
            return self.client
        if self._pinned is None or self._pinned[0] != tls_cert:
            if self._pinned is not None:
                await self._pinned[1].aclose()
            self._pinned = (tls_cert, httpx.AsyncClient(verify=pinned(tls_cert)))
        return self._pinned[1]

    async def healthy(self, base_url: str, timeout_s: float, tls_cert: str = "") -> bool:
        """Poll rank 0's /health until it answers 200; False if the timeout passes first."""
        deadline = time.monotonic() + timeout_s
        client = await self._client(tls_cert)
        while time.monotonic() < deadline:
            try:
                response = await client.get(f"{base_url}/health", timeout=2.0)
                if response.status_code == 200:
                    return True
            except httpx.HTTPError:
                pass  # not listening yet, or loading
            await asyncio.sleep(POLL_S)
        return False

    async def sample(self, base_url: str, tls_cert: str = "") -> ServingSample | None:
        """Rank 0's engine counters from its /metrics; None when it does not answer."""
        try:
            client = await self._client(tls_cert)
            response = await client.get(f"{base_url}/metrics", timeout=2.0)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return parse_sample(response.text)


def parse_sample(metrics_text: str) -> ServingSample:
    families = list(text_string_to_metric_families(metrics_text))
    values = {sample.name: sample.value for family in families for sample in family.samples}
    ttft = [
        (float(sample.labels["le"]), sample.value)
        for family in families
        for sample in family.samples
        if sample.name == f"{metric_names.TIME_TO_FIRST_TOKEN}_bucket"
    ]

    def value(metric: str) -> float:
        return values.get(sample_name(metric), 0.0)

    return ServingSample(
        steps=value(metric_names.STEPS),
        last_step_timestamp=value(metric_names.LAST_STEP_TIMESTAMP),
        running=value(metric_names.REQUESTS_RUNNING),
        waiting=value(metric_names.REQUESTS_WAITING),
        generation_tokens=value(metric_names.GENERATION_TOKENS),
        draft_tokens=value(metric_names.DRAFT_TOKENS),
        accepted_tokens=value(metric_names.ACCEPTED_TOKENS),
        ttft_p50_s=median_of_histogram(ttft),
        ttft_buckets=ttft,
    )


def median_of_histogram(buckets: list[tuple[float, float]]) -> float | None:
    return quantile_of_histogram(buckets, 0.5)


def quantile_of_histogram(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile from cumulative (upper bound, count) buckets, interpolated within its
    bucket as Prometheus' histogram_quantile does; None with no observation."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (upper - lower) * share
        below, lower = count, upper
    return None


class ProgressWatch:
    """Declares a hang when rank 0's engine stops moving.

    Rank 0 steps while it has work and sends a keepalive step every keepalive interval
    when idle, so its last-step timestamp changes at least that often. If the value seen
    here stays the same for hang_timeout_s (on this machine's clock, so node clocks never
    matter), or /metrics stops answering for as long, the gang is hung.
    """

    def __init__(self, hang_timeout_s: float, now: float) -> None:
        self.hang_timeout_s = hang_timeout_s
        self._last_value: tuple[float, float] | None = None
        self._last_change = now
        self.latest: ServingSample | None = None
        self.tokens_per_second = 0.0
        self._latest_at = now

    def observe(self, sample: ServingSample | None, now: float) -> str | None:
        """Feed one sample; returns the reason when the gang counts as hung."""
        if sample is not None:
            if self.latest is not None and now > self._latest_at:
                tokens = sample.generation_tokens - self.latest.generation_tokens
                self.tokens_per_second = max(tokens, 0.0) / (now - self._latest_at)
            self.latest, self._latest_at = sample, now
            value = (sample.steps, sample.last_step_timestamp)
            if value != self._last_value:
                self._last_value, self._last_change = value, now
        stalled = now - self._last_change
        if stalled < self.hang_timeout_s:
            return None
        if sample is None:
            return f"rank 0 has not answered /metrics for {stalled:.0f} s"
        pending = int(sample.running + sample.waiting)
        return f"no engine step for {stalled:.0f} s ({pending} requests pending)"
