"""serving_* Prometheus metrics of rank 0 (base units; histogram buckets in vLLM's style)."""

from __future__ import annotations

import mlx.core as mx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contract import metric_names

# Bucket edges follow vLLM's serving metrics so dashboards line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
COMM_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
                0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServingMetrics:
    """All serving_* metrics, on their own registry (one rank 0 per process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests_running = Gauge(
            metric_names.REQUESTS_RUNNING, "Requests in the batch", registry=r)
        self.requests_waiting = Gauge(
            metric_names.REQUESTS_WAITING, "Requests waiting for a batch slot", registry=r)
        self.time_to_first_token = Histogram(
            metric_names.TIME_TO_FIRST_TOKEN, "Time to first token",
            buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "serving_inter_token_latency_seconds", "Time between tokens of a request",
            buckets=ITL_BUCKETS, registry=r)
        self.e2e_latency = Histogram(
            "serving_e2e_request_latency_seconds", "Request latency, arrival to last token",
            buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "serving_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.prefix_cache_tokens = Counter(
            "serving_prefix_cache_hit_tokens", "Prompt tokens reused from the prefix cache",
            registry=r)
        self.prefix_cache_hits = Counter(
            "serving_prefix_cache_hits", "Requests that reused a cached prefix", registry=r)
        self.generation_tokens = Counter(
            metric_names.GENERATION_TOKENS, "Tokens generated", registry=r)
        self.requests_finished = Counter(
            "serving_requests_finished", "Requests finished, by reason",
            ["finish_reason"], registry=r)
        self.step_duration = Histogram(
            "serving_step_duration_seconds", "Engine step duration (plan + forward + sampling)",
            buckets=STEP_BUCKETS, registry=r)
        self.step_comm = Histogram(
            "serving_step_comm_seconds",
            "Time of one plan collective, header or payload (observed only with comm_profile on)",
            buckets=COMM_BUCKETS, registry=r)
        self.batch_size = Gauge(
            "serving_batch_size", "Sequences decoded in the last step", registry=r)
        self.batch_size_hist = Histogram(
            "serving_batch_size_steps", "Sequences decoded per step",
            buckets=BATCH_BUCKETS, registry=r)
        self.queue_time = Histogram(
            "serving_request_queue_time_seconds", "From arrival to a batch slot",
            buckets=TTFT_BUCKETS, registry=r)
        self.steps = Counter(metric_names.STEPS, "Engine steps run", registry=r)
        self.last_step = Gauge(
            metric_names.LAST_STEP_TIMESTAMP, "Unix time of the last engine step",
            registry=r)
        self.pending = Gauge(
            "serving_requests_pending", "Requests waiting or running (watchdog: pending "
            "work without step progress means a hang)", registry=r)
        for reason in ("stop", "length"):  # exported at 0 before the first finish
            self.requests_finished.labels(finish_reason=reason)
        self._memory_gauges(r)
        self._speculation(r)

    def _speculation(self, r: CollectorRegistry) -> None:
        self.draft_tokens = Counter(
            metric_names.DRAFT_TOKENS, "Draft tokens verified (speculative decoding)",
            registry=r)
        self.accepted_tokens = Counter(
            metric_names.ACCEPTED_TOKENS, "Draft tokens the model accepted", registry=r)
        rate = Gauge(
            metric_names.ACCEPTANCE_RATE, "Accepted / drafted tokens since start (0: none)",
            registry=r)
        rate.set_function(lambda: (
            self.accepted_tokens._value.get() / drafted
            if (drafted := self.draft_tokens._value.get()) else 0.0
        ))

    def _memory_gauges(self, r: CollectorRegistry) -> None:
        self.prefix_cache_bytes = Gauge(
            "serving_prefix_cache_bytes", "KV bytes the prefix cache holds (each rank alike)",
            registry=r)
        self.kv_bytes = Gauge(
            metric_names.KV_CACHE_BYTES, "KV bytes each rank holds or has promised: running "
            "sequences at prompt + max_tokens (padded as the batch pads them) plus the "
            "prefix cache", ["rank"], registry=r)
        self.kv_budget = Gauge(
            metric_names.KV_CACHE_BUDGET_BYTES, "KV bytes each rank may hold ([serving] "
            "kv_cache_gb, else what the weights and the reserve leave)", ["rank"], registry=r)
        # MLX's own allocator on rank 0: Metal memory on a Mac (what RSS does not show).
        active = Gauge(
            "serving_mlx_active_memory_bytes", "Memory held by MLX arrays (rank 0)", registry=r)
        active.set_function(mx.get_active_memory)
        peak = Gauge(
            "serving_mlx_peak_memory_bytes", "Peak memory held by MLX arrays (rank 0)",
            registry=r)
        peak.set_function(mx.get_peak_memory)

    def show_kv(self, budgets: list[int], usage: list[int]) -> None:
        for rank, (budget, used) in enumerate(zip(budgets, usage, strict=True)):
            self.kv_budget.labels(rank=str(rank)).set(budget)
            self.kv_bytes.labels(rank=str(rank)).set(used)
