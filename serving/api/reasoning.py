"""Reasoning kept apart from the answer: the generated text split, as it streams, into
reasoning and content, on the markers the model's own tokenizer declares.

Two syntaxes, both read from what mlx-lm already knows of the model, never from a chat
template of ours:
- "think": the tokenizer wrapper's thinking markers (`tokenizer.has_thinking`,
  `think_start` / `think_end`: `<think>`/`</think>` for Qwen3, DeepSeek-R1/V3.1, GLM-4.5,
  Kimi-K2-Thinking ...). The answer starts inside the reasoning when the rendered prompt
  ends inside an open marker (DeepSeek-R1's template ends with `<think>`), as mlx-lm's
  server decides it; a prompt that closed it (Qwen3 with `enable_thinking: false`) starts
  in content.
- "harmony": gpt-oss's channels (`<|channel|>analysis<|message|>...<|end|>
  <|start|>assistant<|channel|>final<|message|>...`), recognised by `<|channel|>` and
  `<|message|>` in the vocabulary. The `analysis` channel is reasoning; `final` and
  `commentary` are content (harmony tool calls are not parsed: mlx-lm has no parser).
  The answer starts in a header (the template ends with `<|start|>assistant`).
A model with neither passes everything through as content.

The splitter runs before the tool-call parser: calls are parsed out of the content only,
so a call written in the reasoning is not made, and one after it still is.

Stable interface (the Messages, chat and Responses APIs use it):

    splitter = ReasoningSplitter.for_prompt(tokenizer, prompt_tokens)
    for text in deltas:
        for part in splitter.feed(text):       # Part(kind, text), in order
            part.kind in ("reasoning", "content")
    rest = splitter.finish()                  # what was held back (a partial marker)
    splitter.reasoning                        # all reasoning text seen so far
    reasoning, content = split_text(tokenizer, prompt_tokens, whole_text)
    syntax = reasoning_syntax(tokenizer)      # ReasoningSyntax | None
    syntax.kind                               # "think" | "harmony"
    reasoning_fields(text)                    # an earlier turn's reasoning, for templates

Markers are stripped; whitespace right after a section opens (reasoning) or right after
reasoning ends (content) is dropped, as the models put a newline there. `feed` holds back
at most a marker's length of text that could be the start of one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Literal

from mlx_lm.generate import TextStateMachine

Kind = Literal["reasoning", "content"]
REASONING: Kind = "reasoning"
CONTENT: Kind = "content"
HARMONY_CHANNEL = "<|channel|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_END = "<|end|>"
HARMONY_START = "<|start|>"
HARMONY_STOPS = ("<|return|>", "<|call|>")
HARMONY_REASONING_CHANNELS = ("analysis",)
_HEADER_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_FIRST_WORD = re.compile(r"\s*(\w+)")


@dataclass(frozen=True)
class Part:
    kind: Kind
    text: str


@dataclass(frozen=True)
class ReasoningSyntax:
    kind: Literal["think", "harmony"]
    start: str  # "think": the opening marker; "harmony": <|channel|>
    end: str  # "think": the closing marker; "harmony": <|end|>


def reasoning_syntax(tokenizer: Any) -> ReasoningSyntax | None:
    """How this model marks its reasoning, from mlx-lm's tokenizer wrapper; None: it does
    not (everything it writes is content). Kept per tokenizer (one per served model):
    get_vocab() builds the whole vocabulary, ~35 ms for SmolLM2's 49k tokens, which every
    request's handler paid on the event loop and so split requests sent together."""
    try:
        return _kept_syntax(tokenizer)
    except TypeError:  # an unhashable stand-in (tests): read it each time
        return _syntax(tokenizer)


@functools.lru_cache(maxsize=8)
def _kept_syntax(tokenizer: Any) -> ReasoningSyntax | None:
    return _syntax(tokenizer)


def _syntax(tokenizer: Any) -> ReasoningSyntax | None:
    vocab = _vocab(tokenizer)
    if HARMONY_CHANNEL in vocab and HARMONY_MESSAGE in vocab:
        return ReasoningSyntax("harmony", HARMONY_CHANNEL, HARMONY_END)
    if getattr(tokenizer, "has_thinking", False):
        return ReasoningSyntax("think", tokenizer.think_start, tokenizer.think_end)
    return None


def _vocab(tokenizer: Any) -> dict[str, int]:
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError):
        return {}
    return vocab if isinstance(vocab, dict) else {}


def prompt_opens_reasoning(tokenizer: Any, prompt: list[int]) -> bool:
    """The rendered prompt ends inside an open thinking marker (the answer starts as
    reasoning), as mlx-lm's server reads it."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    return bool(tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt))


@dataclass
class ReasoningSplitter:
    """Splits streamed text into reasoning and content parts (see the module's doc)."""

    syntax: ReasoningSyntax | None
    start_in_reasoning: bool = False
    reasoning: str = ""  # every reasoning character fed so far
    _machine: Any = None
    _state: Any = None
    _header: str = ""  # harmony: the current message's header text
    _section: Kind | None = None  # the kind of the latest text handed on
    _trim: bool = False  # drop whitespace until the current section's first character

    @classmethod
    def for_prompt(cls, tokenizer: Any, prompt: list[int]) -> ReasoningSplitter:
        syntax = reasoning_syntax(tokenizer)
        opens = syntax is not None and syntax.kind == "think" and prompt_opens_reasoning(
            tokenizer, prompt)
        return cls(syntax, start_in_reasoning=opens)

    def __post_init__(self) -> None:
        if self.syntax is None:
            return
        if self.syntax.kind == "think":
            edges: dict[str, list[tuple[str, str]]] = {
                CONTENT: [(self.syntax.start, REASONING)],
                REASONING: [(self.syntax.end, CONTENT)],
            }
            first: str = REASONING if self.start_in_reasoning else CONTENT
        else:
            edges, first = _harmony_edges(), "header"
        self._machine = TextStateMachine(edges)
        self._state = self._machine.make_state(first)

    def feed(self, text: str) -> list[Part]:
        """The parts safe to hand on now, in order."""
        if self._machine is None:
            return [Part(CONTENT, text)] if text else []
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._parts(segments)

    def finish(self) -> list[Part]:
        """The text held back as a possible marker, at the end of the generation."""
        if self._machine is None:
            return []
        self._state, rest, state = TextStateMachine.flush(self._state)
        return self._parts([(state, rest)])

    def _parts(self, segments: list[tuple[str, str]]) -> list[Part]:
        out: list[Part] = []
        previous = None
        for state, text in segments:
            if state == "header" and previous not in (None, "header"):
                self._header = ""  # a new message's header starts
            previous = state
            kind = self._kind(state, text)
            if kind is None or not text:
                continue
            if kind != self._section:  # a new section: the models put a newline there
                self._trim = kind == REASONING or bool(self.reasoning)
                self._section = kind
            if self._trim:
                text = text.lstrip()
                if not text:
                    continue
                self._trim = False
            if kind == REASONING:
                self.reasoning += text
            if out and out[-1].kind == kind:
                out[-1] = Part(kind, out[-1].text + text)
            else:
                out.append(Part(kind, text))
        return out

    def _kind(self, state: str, text: str) -> Kind | None:
        if state == REASONING:
            return REASONING
        if state == CONTENT:
            return CONTENT
        if state == "header":
            self._header += text
            return None
        if state == "body":
            found = _HEADER_CHANNEL.search(self._header) or _FIRST_WORD.match(self._header)
            channel = found.group(1) if found else ""
            return REASONING if channel in HARMONY_REASONING_CHANNELS else CONTENT
        return None  # harmony: between a message's end and the next one's start


def _harmony_edges() -> dict[str, list[tuple[str, str]]]:
    """header --<|message|>--> body --<|end|>--> between --<|start|>--> header; a body
    or the space between messages may also go straight on with <|channel|>. A stop
    marker (when the detokenizer writes it) ends the message like <|end|>."""
    stops = [(s, "between") for s in HARMONY_STOPS]
    return {
        "header": [(HARMONY_MESSAGE, "body")],
        "body": [(HARMONY_END, "between"), (HARMONY_CHANNEL, "header"),
                 (HARMONY_START, "header"), *stops],
        "between": [(HARMONY_START, "header"), (HARMONY_CHANNEL, "header"), *stops],
    }


def reasoning_fields(text: str) -> dict[str, str]:
    """An earlier assistant turn's reasoning, under the names chat templates read it by:
    `reasoning_content` (Qwen3, DeepSeek, GLM) and `thinking` (gpt-oss's harmony)."""
    return {"reasoning_content": text, "thinking": text}


def split_text(tokenizer: Any, prompt: list[int], text: str) -> tuple[str, str]:
    """A whole answer's (reasoning, content)."""
    splitter = ReasoningSplitter.for_prompt(tokenizer, prompt)
    parts = [*splitter.feed(text), *splitter.finish()]
    return splitter.reasoning, "".join(p.text for p in parts if p.kind == CONTENT)
