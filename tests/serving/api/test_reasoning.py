"""The reasoning splitter (serving/api/reasoning.py): think markers and harmony channels,
whole and streamed in pieces of every size."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serving.api.reasoning import (
    Part,
    ReasoningSplitter,
    ReasoningSyntax,
    reasoning_syntax,
    split_text,
)

THINK = ReasoningSyntax("think", "<think>", "</think>")
HARMONY = ReasoningSyntax("harmony", "<|channel|>", "<|end|>")


def run(splitter: ReasoningSplitter, text: str, chunk: int) -> tuple[str, str, list[str]]:
    """(reasoning, content, the kinds in the order they came) for `text` fed in pieces."""
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    parts: list[Part] = []
    for piece in pieces:
        parts += splitter.feed(piece)
    parts += splitter.finish()
    kinds: list[str] = []
    for part in parts:
        if not kinds or kinds[-1] != part.kind:
            kinds.append(part.kind)
    content = "".join(p.text for p in parts if p.kind == "content")
    reasoning = "".join(p.text for p in parts if p.kind == "reasoning")
    assert reasoning == splitter.reasoning
    return reasoning, content, kinds


@pytest.mark.parametrize("chunk", [0, 1, 2, 3, 5, 8])
def test_think_markers_split_reasoning_from_the_answer(chunk: int) -> None:
    """<think>...</think>answer: the reasoning, then the answer, markers and the newlines
    after them dropped."""
    text = "<think>\nLet me add 2 and 2. <tag> stays\n</think>\n\nThe answer is 4."
    reasoning, content, kinds = run(ReasoningSplitter(THINK), text, chunk)
    assert reasoning == "Let me add 2 and 2. <tag> stays\n"
    assert content == "The answer is 4."
    assert kinds == ["reasoning", "content"]


@pytest.mark.parametrize("chunk", [0, 1, 4])
def test_a_prompt_that_opened_the_reasoning_starts_in_it(chunk: int) -> None:
    """DeepSeek-R1's template ends the prompt with <think>: the answer starts as reasoning."""
    reasoning, content, _ = run(ReasoningSplitter(THINK, start_in_reasoning=True),
                                "hmm, four</think>4", chunk)
    assert (reasoning, content) == ("hmm, four", "4")


def test_no_markers_is_all_content_and_an_unclosed_think_is_all_reasoning() -> None:
    """Without a syntax everything is content; a cut-off reasoning stays reasoning."""
    assert run(ReasoningSplitter(None), "<think>x</think>y", 3)[:2] == ("", "<think>x</think>y")
    assert run(ReasoningSplitter(THINK), "<think>still think", 2)[:2] == ("still think", "")
    assert run(ReasoningSplitter(THINK), "plain <thi", 2)[:2] == ("", "plain <thi")


HARMONY_TEXT = (
    "<|channel|>analysis<|message|>User wants 2+2. Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
)


@pytest.mark.parametrize("chunk", [0, 1, 3, 7])
def test_harmony_channels(chunk: int) -> None:
    """gpt-oss: the analysis channel is reasoning, the final channel the answer; headers
    and markers are dropped."""
    reasoning, content, kinds = run(ReasoningSplitter(HARMONY), HARMONY_TEXT, chunk)
    assert (reasoning, content, kinds) == ("User wants 2+2. Easy.", "2 + 2 = 4.",
                                           ["reasoning", "content"])


def test_harmony_commentary_is_content_and_a_return_ends_the_message() -> None:
    """A commentary message is content; text after <|return|> is not."""
    text = ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Done.<|return|>")
    assert run(ReasoningSplitter(HARMONY), text, 4)[:2] == ("", "Checking.Done.")


def test_syntax_comes_from_the_tokenizer_wrapper() -> None:
    """mlx-lm's wrapper's think markers, or harmony from the vocabulary; else none."""
    thinker = SimpleNamespace(has_thinking=True, think_start="<think>", think_end="</think>",
                              get_vocab=lambda: {"<think>": 1, "</think>": 2})
    harmony = SimpleNamespace(has_thinking=False,
                              get_vocab=lambda: {"<|channel|>": 1, "<|message|>": 2})
    plain = SimpleNamespace(has_thinking=False, get_vocab=lambda: {"a": 1})
    assert reasoning_syntax(thinker) == THINK
    assert reasoning_syntax(harmony) == HARMONY
    assert reasoning_syntax(plain) is None


def test_split_text_reads_the_prompt() -> None:
    """A prompt ending in an open <think> starts the answer in reasoning, one that closed
    it (enable_thinking false) in content."""
    tok: Any = SimpleNamespace(
        has_thinking=True, think_start="<think>", think_end="</think>",
        get_vocab=lambda: {"<think>": 7, "</think>": 8},
        rfind_think_start=lambda p: max((i for i, t in enumerate(p) if t == 7), default=-1),
        rfind_think_end=lambda p: max((i for i, t in enumerate(p) if t == 8), default=-1),
    )
    assert split_text(tok, [1, 7], "a</think>b") == ("a", "b")
    assert split_text(tok, [1, 7, 8], "a</think>b") == ("", "a</think>b")


def test_a_call_after_the_reasoning_is_parsed_and_one_inside_it_is_not() -> None:
    """The splitter runs before the tool parser: a call in the answer is made, the same
    markup inside the reasoning stays reasoning."""
    from mlx_lm.tool_parsers import json_tools

    from serving.api.tool_calls import ToolCallStream, ToolPlan

    tokenizer = SimpleNamespace(has_tool_calling=True, tool_call_start=json_tools.tool_call_start,
                                tool_call_end=json_tools.tool_call_end,
                                tool_parser=json_tools.parse_tool_call)
    weather = {"type": "function", "function": {"name": "w", "parameters": {}}}
    call = '<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = f"<think>maybe {call}</think>\n\n{call}"
    splitter, calls = ReasoningSplitter(THINK), ToolCallStream(tokenizer, ToolPlan([weather]))
    for i in range(0, len(text), 3):
        for part in splitter.feed(text[i : i + 3]):
            if part.kind == "content":
                calls.feed(part.text)
    calls.finish()
    assert splitter.reasoning == f"maybe {call}"
    assert [(c.function.name, c.function.arguments) for c in calls.calls] == [
        ("w", '{"city": "Paris"}')]


def test_chat_reasoning_fields() -> None:
    """reasoning_effort sets the template's switch unless chat_template_kwargs does; the
    server's own template arguments cannot be overridden; an unknown effort is a 400."""
    import msgspec

    from contract.openai_errors import ApiError
    from contract.openai_schemas import ChatCompletionRequest
    from serving.api.chat_reasoning import template_kwargs

    def kwargs(**fields: Any) -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        return template_kwargs(msgspec.convert(body, ChatCompletionRequest))

    assert kwargs() == {}
    assert kwargs(reasoning_effort="none") == {"enable_thinking": False}
    assert kwargs(reasoning_effort="low",
                  chat_template_kwargs={"enable_thinking": False, "x": 1}) == {
        "enable_thinking": False, "x": 1}
    for bad, param in (({"reasoning_effort": "huge"}, "reasoning_effort"),
                       ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools")):
        with pytest.raises(ApiError) as caught:
            kwargs(**bad)
        assert caught.value.body.param == param
