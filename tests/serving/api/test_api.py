"""The OpenAI API (and Anthropic's Messages) of 1-rank servers, through real HTTP: on the
bundled model where the answer's meaning, its memory or its step time is the point (Paris,
penalties breaking a parrot, timings against a clock, a story long enough to leave), on
the tiny random Llama (its tokenizer, a step ~1/20 of SmolLM2's CPU) where the API's shape
is."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from mlx_lm.utils import load_tokenizer

from testkit import require
from testkit.rank_cluster import RankCluster, rank_cluster
from testkit.waiting import metric_value, wait_until

pytestmark = pytest.mark.e2e

MODEL = "m"  # both servers' model id


def _server(workdir: Path, model_dir: Path) -> Iterator[RankCluster]:
    with rank_cluster(workdir, model_dir, 1, served_model_id=MODEL, max_tokens_limit=512,
                      max_body_bytes=64 * 1024, max_batch_size=4) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path
) -> Iterator[RankCluster]:
    """The bundled SmolLM2."""
    yield from _server(tmp_path_factory.mktemp("api"), bundled_model_dir)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RankCluster]:
    """The tiny random Llama, with the same settings."""
    yield from _server(tmp_path_factory.mktemp("api-tiny"), tiny_model_dir)


@pytest.fixture
def client(server: RankCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def tiny_client(tiny: RankCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny.base_url}/v1", api_key="unused", max_retries=0)


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_openai_chat(client: openai.OpenAI) -> None:
    """Chat completion through the unmodified openai client, with usage."""
    out = client.chat.completions.create(
        model=MODEL,
        messages=chat("What is the capital of France?"),  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in (out.choices[0].message.content or "")
    assert out.usage is not None and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_openai_chat_streaming_matches_non_streaming(tiny_client: openai.OpenAI) -> None:
    """Streamed deltas concatenate to the non-streamed text; include_usage adds a usage chunk."""
    args = {
        "model": MODEL,
        "messages": chat("Name three colours."),
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = tiny_client.chat.completions.create(**args)  # type: ignore[call-overload]
    chunks = list(
        tiny_client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_openai_completions_and_models(tiny_client: openai.OpenAI) -> None:
    """Text completion (plain and streamed) and the model list."""
    out = tiny_client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=6, temperature=0)
    assert out.choices[0].text and out.usage and out.usage.completion_tokens == 6
    streamed = tiny_client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == out.choices[0].text
    assert [m.id for m in tiny_client.models.list()] == [MODEL]


def test_openai_error_unknown_model(tiny_client: openai.OpenAI) -> None:
    """An unknown model is a 404 model_not_found the client raises as NotFoundError."""
    with pytest.raises(openai.NotFoundError) as info:
        tiny_client.chat.completions.create(model="nope", messages=chat("hi"))  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"


def test_prefix_cache_reuses_the_shared_prompt(
    tiny_client: openai.OpenAI, tiny: RankCluster
) -> None:
    """A repeated prompt is served from the prefix cache and gives the same greedy text; the
    cache's hits and bytes are in the metrics."""
    before = metric_value(tiny.base_url, "serving_prefix_cache_hit_tokens_total")
    hits = metric_value(tiny.base_url, "serving_prefix_cache_hits_total")
    runs = [
        tiny_client.chat.completions.create(
            model=MODEL,
            messages=chat("Say hello to Ada."),  # type: ignore[arg-type]
            max_tokens=4,  # the prompt is what is reused
            temperature=0,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert metric_value(tiny.base_url, "serving_prefix_cache_hit_tokens_total") > before
    assert metric_value(tiny.base_url, "serving_prefix_cache_hits_total") > hits
    assert metric_value(tiny.base_url, "serving_prefix_cache_bytes") > 0


def test_stop_string_and_seeded_sampling(tiny_client: openai.OpenAI) -> None:
    """A stop string ends the text before it; the same seed samples the same text twice."""
    free = tiny_client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=8, temperature=0)
    text = free.choices[0].text
    stop = text.strip()[:2]
    cut = tiny_client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    runs = [
        tiny_client.completions.create(
            model=MODEL, prompt="Once", max_tokens=6, temperature=1.0, top_p=0.9, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_logprobs_chat_and_completions(tiny_client: openai.OpenAI) -> None:
    """Greedy: each token's logprob is its list's best; tokens spell the text; streamed
    chunks carry the logprobs of their own tokens; completions give OpenAI's legacy shape."""
    whole = tiny_client.chat.completions.create(
        model=MODEL, messages=chat("Say hello"), max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    # mlx-lm's detokenizer drops the first token's leading space from the text.
    spelt = "".join(t.token for t in content or [])
    assert content and spelt.lstrip() == whole.choices[0].message.content
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert item.top_logprobs[0].token == item.token and item.logprob == tops[0] <= 0
        assert bytes(item.bytes or []) == item.token.encode()
    streamed = tiny_client.chat.completions.create(
        model=MODEL, messages=chat("Say hello"), max_tokens=6, temperature=0,
        logprobs=True, stream=True,
    )
    items = [i for c in streamed if c.choices and c.choices[0].logprobs
             for i in c.choices[0].logprobs.content or []]
    assert [(i.token, i.logprob) for i in items] == [(i.token, i.logprob) for i in content]
    text = tiny_client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=5, temperature=0, logprobs=2
    ).choices[0]
    lp = text.logprobs
    # mlx-lm's detokenizer drops the first token's leading space from the text.
    assert lp is not None and "".join(lp.tokens or []).lstrip() == text.text.lstrip()
    assert len(lp.token_logprobs or []) == len(lp.top_logprobs or []) == len(lp.tokens or [])
    assert all(len(top) == 2 for top in lp.top_logprobs or [])
    assert lp.text_offset == [sum(len(t) for t in (lp.tokens or [])[:i])
                              for i in range(len(lp.tokens or []))]


def test_logit_bias_and_penalties_change_greedy_text(
    client: openai.OpenAI, bundled_model_dir: Path
) -> None:
    """A +100 bias makes greedy decoding pick that token every time; a -100 bias on the
    greedy first token makes another come first; each penalty breaks a repetitive answer;
    min_p filters the sampled tokens."""
    tokenizer = load_tokenizer(bundled_model_dir)

    def complete(max_tokens: int = 4, prompt: str = "yes yes yes", **fields: object) -> str:
        fields.setdefault("temperature", 0)
        return client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, **fields  # type: ignore[arg-type]
        ).choices[0].text

    assert complete(logit_bias={"42": 100}) == tokenizer.decode([42]) * 4
    # The penalties and min_p below compare only first tokens: 2 tokens say enough.
    top = client.completions.create(
        model=MODEL, prompt="yes yes yes", max_tokens=1, temperature=0, logprobs=0
    ).choices[0].logprobs
    first = tokenizer.encode((top.tokens or [""])[0], add_special_tokens=False)  # type: ignore[union-attr]
    assert len(first) == 1
    assert complete(max_tokens=1, logit_bias={str(first[0]): -100}) != complete(max_tokens=1)
    parrot = "The cat sat on the mat. The cat sat on the mat. The cat"
    repeats = complete(5, prompt=parrot)
    assert repeats.startswith("sat on the mat")
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                    {"extra_body": {"repetition_penalty": 2.0}}):
        assert not complete(2, prompt=parrot, **penalty).startswith("sat"), penalty
    # min_p = 1 keeps only the most likely token: sampling at temperature 1 turns greedy.
    greedy = complete(2)
    for seed in (1, 2, 3):
        assert complete(2, temperature=1.0, seed=seed, extra_body={"min_p": 1.0}) == greedy


BAD_BODIES = [
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": chat("x"), "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": chat("x"), "temperature": 2.5}, "temperature"),
    ({"model": MODEL, "messages": chat("x"), "temperature": -0.1}, "temperature"),
    ({"model": MODEL, "messages": chat("x"), "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": chat("x"), "top_p": 1.5}, "top_p"),
    ({"model": MODEL, "messages": chat("x"), "n": 2}, "n"),
    ({"model": MODEL, "messages": "hello"}, "messages"),
    ({"messages": chat("x")}, "model"),
    ({"model": MODEL, "messages": chat("x"), "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": MODEL, "messages": chat("x"), "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": MODEL, "messages": chat("x"), "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": MODEL, "messages": chat("x"), "min_p": 1.5}, "min_p"),
    ({"model": MODEL, "messages": chat("x"), "logit_bias": {"x": 1}}, "logit_bias"),
    ({"model": MODEL, "messages": chat("x"), "logit_bias": {"5": 101}}, "logit_bias"),
    ({"model": MODEL, "messages": chat("x"), "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"model": MODEL, "messages": chat("x"), "logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ({"model": MODEL, "messages": chat("x"), "logit_bias": {"9" * 5000: 1}}, "logit_bias"),
    ({"model": MODEL, "messages": chat("x"), "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"model": MODEL, "messages": chat("x"), "top_logprobs": 2}, "top_logprobs"),
    ({"model": MODEL, "messages": chat("x"), "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"model": MODEL, "messages": chat("x"), "response_format": {"type": "xml"}},
     "response_format.type"),
    ({"model": MODEL, "messages": chat("x"), "audio": {"voice": "alloy"}}, "audio"),
    ({"model": MODEL, "messages": chat("x"), "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tools"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_chat_fields_are_400(server: RankCluster, body: dict[str, object], param: str) -> None:
    """Each invalid field is a 400 in OpenAI's error shape naming the field."""
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_malformed_json_oversized_body_and_unknown_model(server: RankCluster) -> None:
    """Malformed JSON 400, a body over max_body_bytes 413, unknown model 404, a wrong method
    405 with Allow: OpenAI's shape."""
    url = f"{server.base_url}/v1/chat/completions"
    bad = httpx.post(url, content=b'{"model": ', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    huge = json.dumps({"model": MODEL, "messages": chat("x" * 100_000)})
    big = httpx.post(url, content=huge, headers={"content-type": "application/json"})
    assert big.status_code == 413 and "message" in big.json()["error"]
    unknown = httpx.post(url, json={"model": "gpt-9", "messages": chat("x")})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    wrong_method = httpx.get(url)
    assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["allow"]
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_context_overflow_reports_token_counts(server: RankCluster) -> None:
    """Prompt + max_tokens beyond the context is a 400 that states the token counts."""
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "word " * 8000, "max_tokens": 500},
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "8192" in error["message"] and "500 for the completion" in error["message"]


def _stream_chat(base_url: str, prompt: str, out: dict[str, str]) -> None:
    body = {
        "model": MODEL,
        "messages": chat(prompt),
        # Steps of 4 sequences in one batch to compare: the tiny model's steps take ~ms,
        # so enough of them that streams started a few ms apart overlap.
        "max_tokens": 64,
        "temperature": 0,
        "stream": True,
    }
    parts, finish = [], None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                parts.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
    out[prompt] = f"{finish}:{''.join(parts)}"


def test_four_concurrent_streams_share_the_batch(tiny: RankCluster) -> None:
    """4 concurrent streams complete with their sequential text; steps decoded several at once."""
    prompts = [
        "Write a poem about cats.",
        "Write a poem about dogs.",
        "Write a poem about rain.",
        "Write a poem about ice.",
    ]
    alone: dict[str, str] = {}
    for prompt in prompts:
        _stream_chat(tiny.base_url, prompt, alone)
    together: dict[str, str] = {}
    threads = [
        threading.Thread(target=_stream_chat, args=(tiny.base_url, p, together)) for p in prompts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together == alone
    assert all(v.startswith("length:") for v in together.values()), together
    singles = metric_value(tiny.base_url, 'serving_batch_size_steps_bucket{le="1.0"}')
    total = metric_value(tiny.base_url, "serving_batch_size_steps_count")
    assert total > singles


def test_disconnect_mid_stream_removes_the_request(server: RankCluster) -> None:
    """A client that leaves mid-stream has its request removed; a fresh request then completes."""
    body = {"model": MODEL, "prompt": "Write a long story.", "max_tokens": 400, "stream": True,
            "temperature": 0}  # greedy: a sampled story may end on its own right away
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen >= 3:
                break  # leaving the block closes the connection
    wait_until(
        lambda: metric_value(server.base_url, "serving_requests_running") == 0,
        60,
        "the abandoned request to leave the batch",
    )
    assert "(cancelled)" in server.log_text(0)
    r2 = httpx.post(
        f"{server.base_url}/v1/completions",
        timeout=120,
        json={"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0},
    )
    assert r2.status_code == 200 and r2.json()["usage"]["completion_tokens"] == 4


def test_health_and_metrics(server: RankCluster) -> None:
    """/health is 200 when ready; /metrics exposes the serving_* families."""
    health = httpx.get(f"{server.base_url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    text = httpx.get(f"{server.base_url}/metrics").text
    for family in (
        "serving_requests_running",
        "serving_requests_waiting",
        "serving_time_to_first_token_seconds_bucket",
        "serving_inter_token_latency_seconds_bucket",
        "serving_e2e_request_latency_seconds_bucket",
        "serving_prompt_tokens_total",
        "serving_generation_tokens_total",
        "serving_step_duration_seconds_bucket",
        "serving_step_comm_seconds_bucket",
        "serving_batch_size",
        "serving_steps_total",
        "serving_last_step_timestamp_seconds",
        "serving_requests_pending",
    ):
        assert family in text, family
    assert metric_value(server.base_url, "serving_steps_total") > 0
    # Where OpenBLAS is installed the rank loaded it and serves the float32 copy (where CI
    # requires it, its absence fails here).
    if require.openblas():
        assert "BLAS: OpenBLAS" in server.log_text(0) and "-f32" in server.log_text(0)
    # MLX's allocator holds at least the weights (~100 MB of the bundled model).
    active = metric_value(server.base_url, "serving_mlx_active_memory_bytes")
    assert 50e6 < active <= metric_value(server.base_url, "serving_mlx_peak_memory_bytes")


@pytest.fixture
def claude(server: RankCluster) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def test_anthropic_messages_whole_and_streamed(
    claude: anthropic.Anthropic, server: RankCluster
) -> None:
    """The official anthropic client: text blocks; the streamed text equals the whole one,
    usage and stop reason agree; count_tokens counts the same prompt, and the system
    prompt in it."""
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is the capital of France?"}]}],
        "max_tokens": 12,
        "extra_body": {"temperature": 0},  # this client version has no temperature argument
    }
    whole = claude.messages.create(**args)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == MODEL
    text = whole.content[0]
    assert isinstance(text, anthropic.types.TextBlock) and "Paris" in text.text
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens <= 12
    with claude.messages.stream(**args) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text.text
    assert (final.stop_reason, final.usage.output_tokens) == (
        whole.stop_reason, whole.usage.output_tokens)
    args.pop("max_tokens"), args.pop("extra_body")
    assert claude.messages.count_tokens(**args).input_tokens == whole.usage.input_tokens > 0
    system = "You are a geography teacher who answers in one word."
    taught = claude.messages.create(**args, system=system, max_tokens=1)
    counted = claude.messages.count_tokens(**args, system=system).input_tokens
    assert taught.usage.input_tokens == counted != whole.usage.input_tokens


def test_anthropic_event_sequence_and_stop_sequence(tiny: RankCluster) -> None:
    """The raw stream is Anthropic's event sequence; a stop sequence ends the text before
    it and is reported as stop_reason stop_sequence, naming it."""
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}]}
    url = f"{tiny.base_url}/v1/messages"
    with httpx.stream("POST", url, json=body, timeout=120) as reply:
        events = [line.removeprefix("event: ") for line in reply.iter_lines()
                  if line.startswith("event: ")]
    assert events[:2] == ["message_start", "content_block_start"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    plain = httpx.post(url, json={**body, "stream": False}, timeout=120).json()
    text = plain["content"][0]["text"]
    stop = text[3:5]
    cut = httpx.post(url, json={**body, "stream": False, "stop_sequences": [stop]},
                     timeout=120).json()
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)
    assert "".join(b["text"] for b in cut["content"]) == text[: text.index(stop)] != ""


BAD_MESSAGES = [
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "format": "nope"}}}}}},
     "output_config.format.schema"),
    ({"output_config": {"format": {"type": "yaml", "schema": {}}}}, "output_config.format.type"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
     "context_management.edits.0.type"),
    ({"speed": "warp"}, "speed"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t", "signature": "v1.forged"}]}]},
     "messages.1.content.0.signature"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search",
                 "input_schema": {}}]}, "tools.0.type"),
    ({"temperature": 1.5}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "messages.0.content.0"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"n": 2}, "n"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_MESSAGES)
def test_anthropic_fields_we_cannot_honour_are_400_naming_them(
    claude: anthropic.Anthropic, fields: dict[str, Any], param: str
) -> None:
    """Each is a 400 in Anthropic's error shape whose message names the field."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, max_tokens=4, extra_body=fields,
                               messages=[{"role": "user", "content": "x"}])
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"], error


# Every field the anthropic SDK 2.14 and Claude Code 2.1.328 send that has no effect here
# (docs/clients.md, "Request fields"), in the places they send it: each one refused would
# fail every such request.
CLAUDE_CODE_FIELDS: dict[str, Any] = {
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral", "ttl": "5m"},
             "citations": []}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "ok"}, {"type": "tool_reference", "tool_name": "g"}],
             "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                        "cache_control": {"type": "ephemeral"}}]},
    ],
    "metadata": {"user_id": "u"}, "service_tier": "auto", "speed": "standard",
    "diagnostics": {"previous_message_id": "msg_1"}, "inference_geo": "us",
    "container": "c", "user_profile_id": "p", "cache_control": {"type": "ephemeral"},
    "thinking": {"type": "disabled"}, "output_config": {"effort": "low"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "temperature": 0, "top_p": 0.9, "top_k": 40,
}


def test_anthropic_fields_accepted_with_no_effect(tiny: RankCluster) -> None:
    """Claude Code's request shape (?beta=true, anthropic-beta, every no-effect field, a
    system turn inside messages, tool_reference in a tool_result) is answered, alike
    through the anthropic SDK (sampling parameters through extra_body)."""
    claude = anthropic.Anthropic(base_url=tiny.base_url, api_key="x", max_retries=0,
                                 default_headers={"anthropic-beta": "context-management-"
                                                  "2025-06-27,effort-2025-11-24"})
    body = {"model": MODEL, "max_tokens": 4, **CLAUDE_CODE_FIELDS}
    url = f"{tiny.base_url}/v1/messages?beta=true"
    answer = httpx.post(url, json=body, headers={"anthropic-beta": "claude-code-20250219"},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    extra = {k: v for k, v in CLAUDE_CODE_FIELDS.items() if k not in ("messages", "system")}
    sent = claude.messages.create(model=MODEL, max_tokens=4, system=CLAUDE_CODE_FIELDS["system"],
                                  messages=CLAUDE_CODE_FIELDS["messages"], extra_body=extra)
    assert sent.content[0].text == answer.json()["content"][0]["text"]  # type: ignore[union-attr]




def test_anthropic_413_and_chat_max_tokens_above_the_limit(server: RankCluster) -> None:
    """A body over max_body_bytes on /v1/messages is Anthropic's request_too_large; chat's
    max_tokens above the server's limit (OpenCode sends 32000) is capped, not refused."""
    big = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 100_000}]})
    assert big.status_code == 413
    assert big.json()["error"]["type"] == "request_too_large" and big.json()["type"] == "error"
    capped = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": chat("Say hi"), "max_tokens": 32000, "stop": [" "]})
    assert capped.status_code == 200, capped.text


def test_anthropic_unknown_model_and_route_errors(
    claude: anthropic.Anthropic, server: RankCluster
) -> None:
    """An unknown model is Anthropic's not_found_error; a wrong method on /v1/messages is a
    405 in Anthropic's shape too, while the OpenAI routes keep OpenAI's."""
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="claude-x", max_tokens=4,
                               messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    wrong = httpx.get(f"{server.base_url}/v1/messages")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    assert wrong.json()["type"] == "error"


def test_timings_only_when_asked(client: openai.OpenAI) -> None:
    """timings_per_token adds llama.cpp's `timings` to chat and completion answers and to the
    last streamed chunk; without it the answers have none, and the openai client reads both."""
    args: dict[str, Any] = {"model": MODEL, "messages": chat("Say hi"), "max_tokens": 6,
                            "temperature": 0}
    plain = client.chat.completions.create(**args)
    assert "timings" not in (plain.model_extra or {})
    timed = client.chat.completions.create(**args, extra_body={"timings_per_token": True})
    assert timed.choices[0].message.content == plain.choices[0].message.content
    timings = (timed.model_extra or {})["timings"]
    assert set(timings) == {
        "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
        "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    assert timings["prompt_n"] == timed.usage.prompt_tokens  # type: ignore[union-attr]
    assert timings["predicted_n"] == 6 and timings["prompt_ms"] > 0
    assert timings["predicted_per_second"] == pytest.approx(
        6e3 / timings["predicted_ms"], rel=1e-6)
    started = time.monotonic()
    chunks, arrived = [], []
    for chunk in client.chat.completions.create(
            **args, stream=True, extra_body={"timings_per_token": True}):
        chunks.append(chunk)
        arrived.append(time.monotonic())
    elapsed_ms = (time.monotonic() - started) * 1e3
    assert [("timings" in (c.model_extra or {})) for c in chunks][-2:] == [False, True]
    # Against this test's clock: both spans fit in the request's time, and the first to the
    # last token took about what the client saw between their chunks (not 1/1000 of it).
    streamed = (chunks[-1].model_extra or {})["timings"]
    texts = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content]
    seen_ms = (arrived[texts[-1]] - arrived[texts[0]]) * 1e3
    assert 0 < streamed["prompt_ms"] + streamed["predicted_ms"] <= elapsed_ms
    assert streamed["predicted_ms"] >= 0.5 * seen_ms - 5, (streamed, seen_ms)
    assert chunks[-1].choices[0].finish_reason == "length"
    text = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3,
                                     extra_body={"timings_per_token": True})
    assert (text.model_extra or {})["timings"]["predicted_n"] == 3
