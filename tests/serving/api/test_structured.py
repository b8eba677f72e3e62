"""JSON schema to grammar at the API: what compiles, what is a 400 naming where, and the
`response_format` forms of OpenAI chat and completions."""

from __future__ import annotations

import json

import pytest

from contract.openai_errors import ApiError
from contract.openai_schemas import JsonSchemaFormat, ResponseFormat
from serving.api.structured import json_grammar, response_format_grammar

PARAM = "response_format.json_schema.schema"


def refused(schema: dict[str, object], strict: bool = True) -> ApiError:
    with pytest.raises(ApiError) as caught:
        json_grammar(schema, strict=strict, param=PARAM)
    assert caught.value.status == 400
    assert caught.value.body.param == PARAM
    return caught.value


@pytest.mark.parametrize(
    ("schema", "where", "what"),
    [
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "string", "format": "no-such-format"}}}}},
         "at /properties/a/properties/b", "Unknown format"),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/y"}},
          "$defs": {"y": {"type": "strin"}}}, "at /$defs/y", "Invalid type: strin"),
        ({"type": "array", "items": {"type": "string", "pattern": "(?<=x)a"}},
         "at /items", "look-around"),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
         "at /properties/x", "does not exist"),
    ],
    ids=["format", "ref-target", "regex", "dangling-ref"],
)
def test_a_schema_that_does_not_compile_is_a_400_naming_where(
    schema: dict[str, object], where: str, what: str
) -> None:
    """The message names the request field, the JSON pointer inside the schema, and
    llguidance's reason."""
    error = refused(schema)
    assert str(error).startswith(f"{PARAM} cannot be compiled {where}: "), str(error)
    assert what in str(error)


def test_lenient_without_strict() -> None:
    """A keyword the grammar cannot enforce is refused under strict, ignored without."""
    schema = {"type": "object", "properties": {"b": {"type": "string", "format": "nope"}}}
    refused(schema, strict=True)
    grammar = json_grammar(schema, strict=False, param=PARAM)
    assert json.loads(grammar)["grammars"][0]["json_schema"]["properties"] == schema["properties"]


def test_response_format_forms() -> None:
    """text and none carry no grammar; json_object any object; json_schema its schema,
    without one any object; json_schema without its spec is a 400 naming it."""
    assert response_format_grammar(None) == ""
    assert response_format_grammar(ResponseFormat("text")) == ""
    any_object = response_format_grammar(ResponseFormat("json_object"))
    assert json.loads(any_object)["grammars"][0]["json_schema"]["type"] == "object"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    grammar = response_format_grammar(
        ResponseFormat("json_schema", JsonSchemaFormat("p", schema, strict=True)))
    assert json.loads(grammar)["grammars"][0]["json_schema"]["properties"] == schema["properties"]
    unnamed = response_format_grammar(ResponseFormat("json_schema", JsonSchemaFormat("p")))
    assert json.loads(unnamed)["grammars"][0]["json_schema"]["type"] == "object"
    with pytest.raises(ApiError) as caught:
        response_format_grammar(ResponseFormat("json_schema"))
    assert caught.value.body.param == "response_format.json_schema"
