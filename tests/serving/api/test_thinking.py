"""Reasoning kept apart, end to end: a 1-rank tiny model whose tokenizer has real
`<think>` markers, forced (rank_env.FORCED_OUTPUT) to write `<think>...</think>answer`
through the real sampling path, read by the official anthropic and openai SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from contract.rank_env import FORCED_OUTPUT
from testkit.rank_cluster import RankCluster, rank_cluster
from testkit.reasoning_model import write_reasoning_model

pytestmark = pytest.mark.e2e

MODEL = "thinker"
FORCED = "<think>\nTwo and two make four.\n</think>\n\nFour."
REASONING, ANSWER = "Two and two make four.\n", "Four."
ASK: list[Any] = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RankCluster]:
    model = write_reasoning_model(tmp_path_factory.mktemp("thinker") / "m")
    with rank_cluster(tmp_path_factory.mktemp("thinking"), model, 1,
                      env={FORCED_OUTPUT: FORCED}, served_model_id=MODEL,
                      max_tokens_limit=64, max_tokens_default=64) as cluster:
        yield cluster


@pytest.fixture
def claude(server: RankCluster) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def test_streamed_thinking_then_text(claude: anthropic.Anthropic) -> None:
    """Streamed: a thinking block (thinking_delta events, then a signature_delta), then the
    answer's text block; the SDK assembles both."""
    with claude.messages.stream(model=MODEL, max_tokens=32000, messages=ASK,
                                thinking={"type": "adaptive"},
                                output_config={"effort": "high"}) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "signature_delta" in kinds
    assert kinds.index("signature_delta") < kinds.index("text_delta")
    thinking, text = final.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock)
    assert (thinking.thinking, thinking.signature.startswith("v1.")) == (REASONING, True)
    assert isinstance(text, anthropic.types.TextBlock) and text.text == ANSWER
    assert final.stop_reason == "end_turn"
    claude.messages.count_tokens(model=MODEL, **_history(final))  # its signature checks


def _history(first: Any, thinking_edit: dict[str, Any] | None = None) -> dict[str, Any]:
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    fields: dict[str, Any] = {"messages": [
        *ASK, {"role": "assistant", "content": blocks}, {"role": "user", "content": "And 3+3?"}]}
    if thinking_edit is not None:
        fields["extra_body"] = {"context_management": {"edits": [thinking_edit]}}
    return fields


def test_thinking_round_trip_and_a_forged_signature(claude: anthropic.Anthropic) -> None:
    """The thinking sent back next turn is accepted and reaches the prompt unless a
    clear_thinking edit leaves it out; an edited one is a 400 naming its signature;
    display "omitted" sends the text empty and the signature still brings it back."""
    first = claude.messages.create(model=MODEL, max_tokens=64, messages=ASK,
                                   thinking={"type": "enabled", "budget_tokens": 32})
    kept = claude.messages.count_tokens(model=MODEL, **_history(first)).input_tokens
    cleared = claude.messages.count_tokens(model=MODEL, **_history(first, {
        "type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}))
    assert cleared.input_tokens < kept
    again = claude.messages.create(model=MODEL, max_tokens=64, **_history(first))
    assert again.usage.input_tokens == kept and again.content[-1].text == ANSWER
    forged = first.model_copy(deep=True)
    forged.content[0].thinking = "I was told 2 + 2 = 5."  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, max_tokens=8, **_history(forged))
    assert "messages.1.content.0.signature" in caught.value.body["error"]["message"]  # type: ignore[index]
    omitted = claude.messages.create(model=MODEL, max_tokens=64, messages=ASK,
                                     thinking={"type": "adaptive", "display": "omitted"})
    assert omitted.content[0].thinking == ""  # type: ignore[union-attr]
    sent_back = claude.messages.count_tokens(model=MODEL, **_history(omitted)).input_tokens
    assert sent_back == kept


def test_openai_chat_reasoning_content(server: RankCluster) -> None:
    """Chat: message.reasoning_content and streamed delta.reasoning_content, the answer in
    content; reasoning_effort "none" turns the template's thinking switch off (its prompt
    gains the empty think block), chat_template_kwargs reaches the template too."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=32000)
    message = whole.choices[0].message
    assert (message.content, (message.model_extra or {})["reasoning_content"]) == (
        ANSWER, REASONING)
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, stream=True,
                                                 reasoning_effort="high"))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == (
        REASONING)
    assert "".join(d.content or "" for d in deltas) == ANSWER
    plain = whole.usage.prompt_tokens  # type: ignore[union-attr]
    off = client.chat.completions.create(model=MODEL, messages=ASK, reasoning_effort="none")
    kwargs = client.chat.completions.create(
        model=MODEL, messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.prompt_tokens == kwargs.usage.prompt_tokens > plain  # type: ignore[union-attr]


def test_budget_tokens_closes_the_reasoning(claude: anthropic.Anthropic) -> None:
    """thinking.budget_tokens: after that many reasoning tokens the sampler writes the end
    marker on every rank (here over the forced text, which then goes on as the answer)."""
    capped = claude.messages.create(model=MODEL, max_tokens=64, messages=ASK,
                                    thinking={"type": "enabled", "budget_tokens": 3})
    assert capped.content[0].thinking == "Two and"  # type: ignore[union-attr]


HARMONY = ("<|channel|>analysis<|message|>Two and two make four.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>Four.")


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RankCluster]:
    """The tiny model with gpt-oss's harmony markers as tokens (no <think>), forced to
    answer in the analysis, then the final channel."""
    markers = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>")
    model = write_reasoning_model(tmp_path_factory.mktemp("harmony") / "m", markers)
    with rank_cluster(tmp_path_factory.mktemp("harmony-run"), model, 1,
                      env={FORCED_OUTPUT: HARMONY}, served_model_id=MODEL,
                      max_tokens_limit=64, max_tokens_default=64) as cluster:
        yield cluster


def test_harmony_channels_are_kept_apart(harmony_server: RankCluster) -> None:
    """gpt-oss's analysis channel is the reasoning (chat's reasoning_content, a thinking
    block), the final channel the answer; no channel markup reaches either."""
    client = openai.OpenAI(base_url=f"{harmony_server.base_url}/v1", api_key="x",
                           max_retries=0)
    message = client.chat.completions.create(model=MODEL, messages=ASK).choices[0].message
    assert (message.content, (message.model_extra or {})["reasoning_content"]) == (
        ANSWER, "Two and two make four.")
    claude = anthropic.Anthropic(base_url=harmony_server.base_url, api_key="x", max_retries=0)
    with claude.messages.stream(model=MODEL, max_tokens=64, messages=ASK) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Two and two make four."  # type: ignore[union-attr]
    assert final.content[1].text == ANSWER  # type: ignore[union-attr]
