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
