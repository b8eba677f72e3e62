"""Structured outputs through the official `openai` SDK against real ranks: a json_schema
answer validates against its schema at 1 rank, 2 pipeline ranks and 2 tensor ranks, each
time batched with an unconstrained request and with speculation on; json_object gives a
JSON object; a schema the grammar engine cannot compile is a 400 naming where.

1 rank serves the bundled SmolLM2; 2 tensor and 2 pipeline ranks the tiny random Llama
(the bundled model's 9 heads shard only at 3 ranks, ~1.5 s a step on 2 cores; a step
of it at 2 pipeline ranks costs ~0.5 s of CPU, of the tiny one ~ms). Its answers are
gibberish, so valid JSON there is the mask's doing alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import jsonschema_rs
import openai
import pytest

from testkit.rank_cluster import RankCluster, rank_cluster

pytestmark = pytest.mark.e2e

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK = "Ann is 30. Answer with her name and age as JSON."
FREE = "Say hello."
MAX_TOKENS = 24  # the JSON above takes ~12
FREE_TOKENS = 8
SPECULATE = {"speculative": "prompt_lookup", "num_draft_tokens": 4}


def client(cluster: RankCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="-", max_retries=0,
                         timeout=300)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True}}


def ask(cluster: RankCluster, content: str, **fields: Any) -> str:
    fields.setdefault("max_tokens", MAX_TOKENS)
    answer = client(cluster).chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], **fields)
    return answer.choices[0].message.content or ""


def constrained_beside_free(cluster: RankCluster, **sampling: Any) -> tuple[str, str]:
    """A json_schema request and an unconstrained one sent together (one batch)."""
    with ThreadPoolExecutor(2) as pool:
        structured = pool.submit(ask, cluster, ASK, response_format=schema_format(SCHEMA),
                                 **sampling)
        free = pool.submit(ask, cluster, FREE, temperature=0, max_tokens=FREE_TOKENS)
        return structured.result(), free.result()


def assert_valid(text: str) -> None:
    jsonschema_rs.validate(SCHEMA, json.loads(text))


def assert_in_step(cluster: RankCluster) -> None:
    for rank in range(cluster.world_size):
        assert "DESYNC" not in cluster.log_text(rank)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path
           ) -> Iterator[RankCluster]:
    with rank_cluster(tmp_path_factory.mktemp("one"), bundled_model_dir, 1,
                      served_model_id="m", **SPECULATE) as cluster:
        yield cluster


def test_json_schema_at_one_rank_beside_an_unconstrained_request(single: RankCluster) -> None:
    """The constrained answer validates; the unconstrained one in the same batch is what
    it is alone (the mask is per sequence)."""
    alone = ask(single, FREE, temperature=0, max_tokens=FREE_TOKENS)
    structured, free = constrained_beside_free(single, temperature=0)
    assert_valid(structured)
    assert free == alone


def test_json_object_is_a_json_object(single: RankCluster) -> None:
    """json_object: any JSON object."""
    text = ask(single, ASK, response_format={"type": "json_object"}, temperature=0,
               max_tokens=40)
    assert isinstance(json.loads(text), dict)


def test_a_schema_that_does_not_compile_is_a_400_naming_where(single: RankCluster) -> None:
    """The SDK's BadRequestError names the field and the pointer inside the schema."""
    bad = {"type": "object", "properties": {"when": {"type": "string", "format": "nope"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        ask(single, ASK, response_format=schema_format(bad))
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "response_format.json_schema.schema"
    assert "at /properties/when: Unknown format: nope" in error["message"]


def test_json_schema_at_two_pipeline_ranks(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A random model, greedy, at two pipeline ranks (a layer each) answers valid JSON, the
    ranks in step."""
    with rank_cluster(tmp_path, tiny_model_dir, 2, served_model_id="m",
                      pipeline_split=[1, 1], **SPECULATE) as cluster:
        structured, free = constrained_beside_free(cluster, temperature=0)
        assert_valid(structured)
        assert free
        assert_in_step(cluster)


def test_json_schema_at_two_tensor_ranks(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A random model sampled at two tensor ranks still answers valid JSON, in step."""
    with rank_cluster(tmp_path, tiny_model_dir, 2, served_model_id="m", **SPECULATE) as cluster:
        structured, free = constrained_beside_free(cluster, temperature=1.0, seed=11)
        assert_valid(structured)
        assert free
        assert_in_step(cluster)


def test_messages_output_config_format_and_responses_text_format(single: RankCluster) -> None:
    """Anthropic's output_config.format (the anthropic SDK) and the Responses API's
    text.format (the openai SDK) constrain the answer through the same grammar."""
    messages = anthropic.Anthropic(base_url=single.base_url, api_key="-", max_retries=0)
    answer = messages.messages.create(
        model="m", max_tokens=MAX_TOKENS, extra_body={"temperature": 0},  # not in SDK 2.14
        messages=[{"role": "user", "content": ASK}],
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    assert_valid("".join(b.text for b in answer.content if b.type == "text"))
    response = client(single).responses.create(
        model="m", input=ASK, max_output_tokens=MAX_TOKENS, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA,
                         "strict": True}},
    )
    assert_valid(response.output_text)
