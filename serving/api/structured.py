"""Structured outputs at the API: a JSON schema (or "any JSON object") turned into the
grammar the engine carries in SamplingParams.grammar, checked here so a schema the
grammar engine cannot compile is the client's 400, never an engine failure.

The grammar engine is llguidance (serving/engine/grammar.py; docs/serving.md says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from contract.openai_errors import ApiError
from contract.openai_schemas import ResponseFormat
from serving.api.errors import invalid

# Compact JSON with the separators models write (`{"a": 1, "b": 2}`), no free whitespace:
# with flexible whitespace a small model can spend its max_tokens on blank lines. A schema
# may choose otherwise with llguidance's own `x-guidance` options.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
_MAX_LOCATE = 200  # sub-schemas tried when looking for where a schema fails


def json_grammar(schema: dict[str, Any] | None, *, strict: bool, param: str) -> str:
    """The grammar for SamplingParams.grammar that makes the answer JSON matching `schema`.

    schema: a JSON schema (an object; `$defs`/`definitions` and `$ref` are followed), or
        None for any JSON object (OpenAI's `json_object`).
    strict: True (OpenAI `strict: true`, Anthropic's and Responses' formats) refuses a
        schema keyword the grammar engine cannot enforce; False compiles leniently,
        ignoring such keywords (still constrained to the rest of the schema).
    param: where the schema sits in the request, as the API names fields
        (`response_format.json_schema.schema`, `output_config.format.schema`,
        `text.format.schema`): the 400's `param`.

    Raises ApiError 400 (invalid_request_error) whose message says what failed and at
    which JSON pointer inside the schema when it can be found, e.g.
    `response_format.json_schema.schema cannot be compiled at /properties/a: Unknown
    format: weird`; serving/api/errors.py renders it in each API's error shape (OpenAI's,
    Anthropic's on /v1/messages). ApiError 500 when llguidance is not installed.
    Pure and quick (~1 ms for a small schema): call it from a handler.

    Use: `SamplingParams(..., grammar=json_grammar(schema, strict=..., param=...))`;
    `grammar=""` (the default) is unconstrained. E.g. Anthropic `output_config.format`
    `{"type": "json_schema", "schema": S}` -> `json_grammar(S, strict=True,
    param="output_config.format.schema")`; Responses `text.format` `{"type":
    "json_schema", "name", "schema": S, "strict": b}` -> `json_grammar(S, strict=bool(b),
    param="text.format.schema")`, `{"type": "json_object"}` -> `json_grammar(None,
    strict=True, param="text.format")`.
    """
    problem = compile_error(ANY_OBJECT if schema is None else schema, strict)
    if problem is None:
        return _grammar(ANY_OBJECT if schema is None else schema, strict)
    assert schema is not None  # "any object" always compiles
    where = locate(schema, strict, problem)
    at = f" at {where}" if where else ""
    raise invalid(f"{param} cannot be compiled{at}: {problem}", param, "invalid_schema")


def _llmatcher() -> Any:
    """llguidance's LLMatcher (imported lazily: only structured requests need it)."""
    try:
        from llguidance import LLMatcher
    except ImportError as exc:  # the server's install, not the client's request
        raise ApiError(500, "structured outputs need the llguidance package on every node "
                       "(scripts/setup-venv and `orchestrator bootstrap` install it)") from exc
    return LLMatcher


def _grammar(schema: dict[str, Any], strict: bool) -> str:
    LLMatcher = _llmatcher()

    overrides = None if strict else {"lenient": True}
    return LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults=JSON_OPTIONS, overrides=overrides)


def compile_error(schema: dict[str, Any], strict: bool) -> str | None:
    """llguidance's message when `schema` does not compile, else None."""
    LLMatcher = _llmatcher()
    try:
        grammar = _grammar(schema, strict)
    except (ValueError, TypeError) as exc:  # not serializable, not an object
        return str(exc)
    message = LLMatcher.validate_grammar(grammar, None)
    return message.strip() or None


def locate(schema: dict[str, Any], strict: bool, problem: str) -> str | None:
    """The JSON pointer of the deepest sub-schema that fails alone with the same message
    (compiled beside the root's definitions, so its `$ref`s resolve); None if none does."""
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
    found: str | None = None
    for count, (pointer, sub) in enumerate(_subschemas(schema, "")):
        if count >= _MAX_LOCATE:
            break
        if compile_error({**sub, **defs}, strict) == problem:
            found = pointer  # depth first: a later hit inside this one is deeper
    return found


def _subschemas(schema: dict[str, Any], pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, sub-schema) of every nested schema, parents before children."""
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
                value, dict):
            for name, sub in value.items():
                yield from _nested(sub, f"{pointer}/{key}/{_escape(name)}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _nested(sub, f"{pointer}/{key}/{i}")
        elif key in ("items", "additionalProperties", "not"):
            yield from _nested(value, f"{pointer}/{key}")


def _nested(sub: object, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(sub, dict):
        yield pointer, sub
        yield from _subschemas(sub, pointer)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def response_format_grammar(response_format: ResponseFormat | None) -> str:
    """OpenAI chat and completions' `response_format`: "" for none or `text`, else the
    grammar of `json_object` or `json_schema`."""
    if response_format is None or response_format.type == "text":
        return ""
    if response_format.type == "json_object":
        return json_grammar(None, strict=True, param="response_format")
    spec = response_format.json_schema
    if spec is None:
        raise invalid("response_format of type json_schema needs its json_schema",
                      "response_format.json_schema")
    return json_grammar(
        spec.schema, strict=bool(spec.strict), param="response_format.json_schema.schema")
