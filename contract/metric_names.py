"""The serving_* metrics of rank 0 that the orchestrator reads back (progress watchdog,
status). Counters are exposed with a `_total` suffix; `sample_name` gives that name."""

from __future__ import annotations

REQUESTS_RUNNING = "serving_requests_running"
REQUESTS_WAITING = "serving_requests_waiting"
STEPS = "serving_steps"  # counter
GENERATION_TOKENS = "serving_generation_tokens"  # counter
LAST_STEP_TIMESTAMP = "serving_last_step_timestamp_seconds"
TIME_TO_FIRST_TOKEN = "serving_time_to_first_token_seconds"  # histogram
DRAFT_TOKENS = "serving_spec_draft_tokens"  # counter: drafts verified (speculative decoding)
ACCEPTED_TOKENS = "serving_spec_accepted_tokens"  # counter: drafts the model kept
KV_CACHE_BYTES = "serving_kv_cache_bytes"  # per rank: running sequences' KV + prefix cache
KV_CACHE_BUDGET_BYTES = "serving_kv_cache_budget_bytes"  # per rank
ACCEPTANCE_RATE = "serving_spec_acceptance_rate"  # accepted / drafted since start

COUNTERS = frozenset({STEPS, GENERATION_TOKENS, DRAFT_TOKENS, ACCEPTED_TOKENS})


def sample_name(metric: str) -> str:
    """The name a metric's value has in the Prometheus text format."""
    return f"{metric}_total" if metric in COUNTERS else metric
