"""Reasoning items on /v1/responses, end to end: a 1-rank tiny model whose tokenizer has real
`<think>` markers (testkit/reasoning_model.py), forced to write `<think>...</think>answer`
through the real sampling path, read by the official openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from contract.rank_env import FORCED_OUTPUT
from testkit.rank_cluster import rank_cluster
from testkit.reasoning_model import write_reasoning_model

pytestmark = pytest.mark.e2e

MODEL = "thinker"
FORCED = "<think>\nTwo and two make four.\n</think>\n\nFour."
REASONING, ANSWER = "Two and two make four.\n", "Four."


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    model = write_reasoning_model(tmp_path_factory.mktemp("thinker") / "m")
    with rank_cluster(tmp_path_factory.mktemp("responses-thinking"), model, 1,
                      env={FORCED_OUTPUT: FORCED}, served_model_id=MODEL,
                      max_tokens_limit=64, max_tokens_default=64) as cluster:
        yield openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0)


def test_reasoning_item_streamed_and_sent_back(client: openai.OpenAI) -> None:
    """Streamed: a reasoning item (reasoning_text deltas) before the answer's message, the
    reasoning tokens in usage; the item sent back with only its encrypted_content is
    accepted and reaches the prompt; a forged one is a 400 naming it."""
    ask: list[Any] = [{"role": "user", "content": "What is 2 + 2?"}]
    with client.responses.stream(model=MODEL, input=ask, reasoning={"effort": "high"},
                                 include=["reasoning.encrypted_content"]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds.index("response.reasoning_text.delta") < kinds.index(
        "response.output_text.delta")
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == REASONING and final.output_text == ANSWER
    assert message.type == "message"
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens > 0
    sealed: dict[str, Any] = {"type": "reasoning", "id": reasoning.id, "summary": [],
              "encrypted_content": reasoning.encrypted_content}

    def turn(item: dict[str, Any]) -> list[Any]:
        return [*ask, item, message.model_dump(exclude_none=True),
                {"role": "user", "content": "And 3 + 3?"}]

    kept = client.responses.create(model=MODEL, input=turn(sealed))
    later: list[Any] = [*ask, message.model_dump(exclude_none=True),
                        {"role": "user", "content": "And 3 + 3?"}]
    dropped = client.responses.create(model=MODEL, input=later)
    assert kept.usage is not None and dropped.usage is not None
    assert kept.usage.input_tokens > dropped.usage.input_tokens  # the reasoning is in it
    with pytest.raises(openai.BadRequestError) as forged:
        client.responses.create(model=MODEL, input=turn(
            {**sealed, "encrypted_content": "v1.AAAA.Zm9yZ2Vk"}))
    assert forged.value.body["param"] == "input.1.encrypted_content"  # type: ignore[index]
