"""schemathesis run against a gateway's /openapi.json, with this project's own rules.

`fuzz()` runs the schemathesis CLI in a child process with this module as its hooks
(SCHEMATHESIS_HOOKS), which add two things to its built-in checks:

- every 4xx/5xx body must be an OpenAI error object (`contract.openai_errors.ErrorEnvelope`),
  on /v1/responses too, or on /v1/messages an Anthropic one
  (`contract.anthropic_schemas.AnthropicErrorEnvelope`);
- half of the valid bodies are tamed (map_case) so that they reach rank 0's engine rather
  than all ending in a 400 or in a 404 for an unknown model (FUZZ_SERVED_MODEL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import schemathesis

from contract.anthropic_schemas import MESSAGES_PATH, PROMPT_ROLES, AnthropicErrorEnvelope
from contract.openai_errors import ErrorEnvelope
from contract.responses_schemas import RESPONSES_PATH
from serving.api.validation import ROLES

ROOT = Path(__file__).resolve().parents[1]
MODEL_ENV = "FUZZ_SERVED_MODEL"
# All but positive_data_acceptance: rank 0 refuses values the schema's types allow (an
# unknown model, n > 1, temperature > 2 ...), with a 400 or 404 in OpenAI's shape.
CHECKS = ["all"]
EXCLUDED_CHECKS = ["positive_data_acceptance"]
# Fields any value of whose documented type rank 0 takes (token ids in a prompt aside).
TAMED_FIELDS = {"messages", "prompt", "stream", "stream_options", "stop", "seed", "user",
                "metadata", "store"}
TAMED_MESSAGES_FIELDS = {"messages", "system", "stream", "metadata"}
TAMED_RESPONSES_FIELDS = {"input", "instructions", "stream", "metadata", "store", "user",
                          "prompt_cache_key", "client_metadata", "parallel_tool_calls"}
TAMED_MAX_TOKENS = 8  # /v1/messages requires max_tokens: a quick one


@schemathesis.check
def openai_error_shape(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """Every error is `{"error": {"message", "type", "param", "code"}}`, or Anthropic's
    `{"type": "error", "error": {"type", "message"}}` on /v1/messages."""
    if response.status_code < 400:
        return None
    anthropic = case.path.startswith(MESSAGES_PATH)
    try:
        msgspec.json.decode(
            response.content, type=AnthropicErrorEnvelope if anthropic else ErrorEnvelope
        )
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise AssertionError(
            f"a {response.status_code} not in {'Anthropic' if anthropic else 'OpenAI'}'s "
            f"error shape ({exc}): "
            f"{response.content[:300]!r}"
        ) from None
    return True


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    """Half of the valid bodies (by the parity of their JSON's length) are made to pass rank
    0's checks of values, so that they reach its engine: only the fields whose every value
    of the documented type is valid, the served model, "user" for an unknown role."""
    served, body = os.environ.get(MODEL_ENV), case.body
    if served is None or case.meta is None or case.meta.generation.mode.is_negative:
        return case
    if not isinstance(body, dict) or len(json.dumps(body)) % 2:
        return case
    anthropic = case.path.startswith(MESSAGES_PATH)
    fields = TAMED_MESSAGES_FIELDS if anthropic else TAMED_FIELDS
    if case.path == RESPONSES_PATH:
        fields = TAMED_RESPONSES_FIELDS
        if not isinstance(body.get("input"), str):  # any string is a valid input
            body["input"] = json.dumps(body.get("input"))
    tamed = {k: v for k, v in body.items() if k in fields}
    messages = tamed.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") not in (
            PROMPT_ROLES if anthropic else ROLES
        ):
            message["role"] = "user"
    case.body = {**tamed, "model": served}
    if case.path == MESSAGES_PATH:
        case.body["max_tokens"] = TAMED_MAX_TOKENS
    return case


# A fixed seed: each run tries the same requests, so a red run is a change's fault, not
# the draw's. Set ORCHESTRATOR_FUZZ_SEED to explore other draws.
SEED_ENV, SEED = "ORCHESTRATOR_FUZZ_SEED", "7627080744808118002665286952037780291"


def fuzz(
    url: str,
    model: str,
    workdir: Path,
    *,
    api_key: str | None,
    max_examples: int,
    phases: tuple[str, ...] | None = None,
    timeout_s: float = 240.0,
) -> subprocess.CompletedProcess[str]:
    """`schemathesis run` on url's /openapi.json, one worker (the machine is small), in
    `workdir` (where schemathesis and Hypothesis keep their files)."""
    args = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--max-examples", str(max_examples), "--workers", "1", "--request-timeout", "60",
        "--checks", ",".join(CHECKS), "--exclude-checks", ",".join(EXCLUDED_CHECKS),
        "--no-color", "--seed", os.environ.get(SEED_ENV, SEED),
    ]
    if phases is not None:
        args += ["--phases", ",".join(phases)]
    if api_key is not None:
        args += ["--header", f"Authorization: Bearer {api_key}"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "SCHEMATHESIS_HOOKS": __name__, MODEL_ENV: model}
    return subprocess.run(
        args, capture_output=True, text=True, cwd=workdir, env=env, timeout=timeout_s, check=False
    )
