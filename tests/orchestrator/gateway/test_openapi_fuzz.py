"""schemathesis against the gateway's own /openapi.json, on a real 1-rank cluster of the tiny
model, with and without the API key: no 5xx, every error in OpenAI's shape, the documented
statuses, content types and bodies, 405 with Allow; the cluster still answers afterwards."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.openapi_fuzz import fuzz
from testkit.orchestrator_process import running, write_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
KEY = "fuzz-key"
# Generated requests per operation in the fuzzing phase: without the key each is a quick
# 401, so fewer do.
EXAMPLES = {KEY: 15, None: 5}
# The coverage phase's boundary cases (~2,600, the same every run: ~30 s here) run with the
# key, where they reach validation and the engine, and where it sends the unexpected methods
# (405 with Allow). Without the key the gateway answers each with the same 401 before reading
# the body, so there the generated phases (examples, fuzzing, stateful) check that 401.
PHASES: dict[str | None, tuple[str, ...] | None] = {
    KEY: None, None: ("examples", "fuzzing", "stateful")}


class Served:
    def __init__(self, url: str, model: str, workdir: Path) -> None:
        self.url, self.model, self.workdir = url, model, workdir

    def completed(self) -> float:
        """Requests rank 0's engine finished, read through the gateway's /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "serving_requests_finished_total"
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Served]:
    """One local rank of the tiny model behind a gateway that wants an API key; at most 8
    tokens a request, so that every fuzzed request is quick (~120 of them reach the
    engine, and most end at the limit)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    config = write_cluster(
        tmp, str(tiny_model_dir), [{"name": "a"}],
        api={"api_key_env": "FUZZ_API_KEY"},
        serving={"max_tokens_limit": 8, "max_tokens_default": 4},
        supervisor={"standby_ranks": False},
    )
    api = tomllib.loads(config.read_text())["api"]
    url = f"http://{api['host']}:{api['port']}"
    with running(config, {"FUZZ_API_KEY": KEY}, url):
        yield Served(url, tiny_model_dir.name, tmp)


@pytest.mark.parametrize("api_key", [KEY, None], ids=["with-key", "without-key"])
def test_the_fuzzer_finds_nothing(served: Served, api_key: str | None) -> None:
    """schemathesis's checks and ours (OpenAI's error shape) pass on every generated request."""
    before = served.completed()
    started = time.monotonic()
    examples = EXAMPLES[api_key]
    run = fuzz(served.url, served.model, served.workdir, api_key=api_key, max_examples=examples,
               phases=PHASES[api_key])
    print(f"schemathesis took {time.monotonic() - started:.0f} s:\n{run.stdout[-3000:]}")
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    if api_key:  # the fuzzed requests got past validation into the engine, not only 4xx
        assert served.completed() > before


def test_the_cluster_still_answers_after_the_fuzzing(served: Served) -> None:
    """A normal completion succeeds once the fuzzer is done."""
    body = {"model": served.model, "prompt": "Hello", "max_tokens": 4}
    reply = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_the_anthropic_client_through_the_gateway(served: Served) -> None:
    """The official anthropic client through the gateway: the key as x-api-key (its
    default) or as a Bearer token, whole and streamed; a wrong key is its
    AuthenticationError."""
    body: dict[str, Any] = {"model": served.model, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "Hello"}]}
    claude = anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0)
    whole = claude.messages.create(**body)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 4
    bearer = anthropic.Anthropic(base_url=served.url, auth_token=KEY, max_retries=0)
    with bearer.messages.stream(**body) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"
    wrong = anthropic.Anthropic(base_url=served.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(**body)
