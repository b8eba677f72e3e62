"""The admission chat and text completions share: decode and check the body, wait for
nothing, render the prompt with the served model, hand the request to the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from litestar import Request

from contract.openai_schemas import ChatCompletionRequest, SamplingFields
from serving.api.generation import Admitted, admit, random_seed, ready
from serving.api.state import ServedModel, ServingState
from serving.api.structured import response_format_grammar
from serving.api.validation import (
    check_request,
    decode_body,
    effective_max_tokens,
    logit_bias_pairs,
    requested_max_tokens,
    stop_list,
)
from serving.engine.step_plan import SamplingParams

T = TypeVar("T", bound=SamplingFields)


@dataclass(frozen=True)
class OpenAIAdmission(Generic[T]):
    """A checked request, the model serving it, and its admitted generation."""

    req: T
    model: ServedModel
    top: int | None  # logprobs asked for: top tokens per token; None for none
    admitted: Admitted


async def admit_openai(
    request: Request,
    serving: ServingState,
    kind: type[T],
    prompt_of: Callable[[T, Any], list[int]],
) -> OpenAIAdmission[T]:
    """`prompt_of(req, tokenizer)` renders the checked request's prompt."""
    req = decode_body(await request.body(), kind)
    top = check_request(req, serving.model_ids, serving.settings.serving.max_tokens_limit)
    engine, model = ready(serving)
    prompt = await serving.prompts.run(engine, prompt_of, req, model.tokenizer)
    max_tokens = effective_max_tokens(requested_max_tokens(req), serving.settings)
    param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
    admitted = admit(
        serving, prompt, sampling_params(req, max_tokens, model), stop_list(req), top, param
    )
    return OpenAIAdmission(req, model, top, admitted)


def sampling_params(fields: SamplingFields, max_tokens: int, model: ServedModel) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if fields.temperature is None else fields.temperature,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        top_k=fields.top_k or 0,
        max_tokens=max_tokens,
        seed=random_seed() if fields.seed is None else fields.seed % (1 << 62),
        min_p=fields.min_p or 0.0,
        repetition_penalty=fields.repetition_penalty or 1.0,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        logit_bias=logit_bias_pairs(fields.logit_bias, model.vocab_size),
        forced=model.forced_output,
        grammar=response_format_grammar(fields.response_format),
    )
