"""One response's output items, built as the engine's text arrives, each step also an event
of the Responses stream in the order OpenAI's SDK and Codex CLI parse it:

    response.created, response.in_progress,
    per reasoning run: output_item.added (reasoning), content_part.added (reasoning_text),
        reasoning_text.delta..., reasoning_text.done, content_part.done, output_item.done,
    per text run: output_item.added (message), content_part.added, output_text.delta...,
        output_text.done, content_part.done, output_item.done,
    per call: output_item.added (function_call), function_call_arguments.delta,
        function_call_arguments.done, output_item.done (custom tools: custom_tool_call_input.*),
    response.completed, or response.incomplete (the output cap), or response.failed.

A whole (not streamed) answer is the same build with its events dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from contract.openai_schemas import ToolCall
from contract.responses_schemas import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    CustomToolCallItem,
    FunctionCallItem,
    IncompleteDetails,
    Lifecycle,
    LifecycleType,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseError,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
    responses_event,
)
from serving.engine.requests import Finished

CallItem = FunctionCallItem | CustomToolCallItem


@dataclass
class ResponseBuild:
    """`template`: the response as created (its echoed request fields, no output yet);
    `item_of`: a parsed call as its output item; `new_id`: ids of the items; `seal`: the
    reasoning's opaque `encrypted_content` (None: not asked for)."""

    template: Response
    item_of: Callable[[ToolCall], CallItem]
    new_id: Callable[[str], str]
    seal: Callable[[str], str] | None = None
    count: Callable[[str], int] = len  # a text's tokens (usage's reasoning_tokens)
    items: list[OutputItem] = field(default_factory=list)
    sequence: int = 0
    _message: OutputMessage | None = None
    _reasoning: ReasoningItem | None = None

    def _event(self, payload: msgspec.Struct) -> bytes:
        payload.sequence_number = self.sequence  # type: ignore[attr-defined]
        self.sequence += 1
        return responses_event(payload)

    def _lifecycle(self, kind: LifecycleType, response: Response) -> bytes:
        return self._event(Lifecycle(type=kind, response=response))

    def start(self) -> list[bytes]:
        return [self._lifecycle("response.created", self.template),
                self._lifecycle("response.in_progress", self.template)]

    def add(self, text: str, calls: list[ToolCall]) -> list[bytes]:
        """A run of answer text (opening a message item) and calls that completed."""
        out: list[bytes] = self._close_reasoning() if text or calls else []
        if text:
            out += self._open_message()
            out.append(self._event(TextDeltaEvent(
                type="response.output_text.delta", item_id=self._id(),
                output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=[],
            )))
            assert self._message is not None
            self._message.content[0].text += text
        for call in calls:
            out += self._close_message("completed") + self._call(self.item_of(call))
        return out

    def reason(self, text: str) -> list[bytes]:
        """A run of reasoning text, in a reasoning item of its own (one per run)."""
        out = self._close_message("completed")
        if self._reasoning is None:
            self._reasoning = ReasoningItem(self.new_id("rs"), content=[])
            out += self._open(self._reasoning, ReasoningText(""))
        item, at = self._reasoning, len(self.items) - 1
        out.append(self._event(TextDeltaEvent(type="response.reasoning_text.delta",
                                              item_id=item.id, output_index=at,
                                              content_index=0, delta=text)))
        assert item.content is not None
        item.content[0].text += text
        return out

    def _close_reasoning(self) -> list[bytes]:
        item, self._reasoning = self._reasoning, None
        if item is None or item.content is None:
            return []
        text, at = item.content[0].text, self.items.index(item)
        if self.seal is not None:
            item.encrypted_content = self.seal(text)
        return [
            self._event(TextDoneEvent(type="response.reasoning_text.done", item_id=item.id,
                                      output_index=at, content_index=0, text=text)),
            self._event(ContentPartEvent(type="response.content_part.done", item_id=item.id,
                                         output_index=at, content_index=0,
                                         part=ReasoningText(text))),
            self._event(OutputItemEvent(type="response.output_item.done", output_index=at,
                                        item=item)),
        ]

    def _open(self, item: OutputMessage | ReasoningItem,
              part: OutputText | ReasoningText) -> list[bytes]:
        """output_item.added (the item as yet without content), content_part.added."""
        self.items.append(item)
        at = len(self.items) - 1
        added = self._event(OutputItemEvent(type="response.output_item.added", output_index=at,
                                            item=item))
        assert item.content is not None
        item.content.append(part)  # type: ignore[arg-type]  # a message takes output_text
        empty = msgspec.structs.replace(part, text="")
        return [added, self._event(ContentPartEvent(
            type="response.content_part.added", item_id=item.id, output_index=at,
            content_index=0, part=empty))]

    def _id(self) -> str:
        assert self._message is not None
        return self._message.id

    def _open_message(self) -> list[bytes]:
        if self._message is not None:
            return []
        self._message = OutputMessage(self.new_id("msg"), "in_progress", [])
        return self._open(self._message, OutputText(""))

    def _close_message(self, status: str) -> list[bytes]:
        message, self._message = self._message, None
        if message is None:
            return []
        message.status = status
        at, text = self.items.index(message), message.content[0].text
        return [
            self._event(TextDoneEvent(type="response.output_text.done", item_id=message.id,
                                      output_index=at, content_index=0, text=text,
                                      logprobs=[])),
            self._event(ContentPartEvent(type="response.content_part.done", item_id=message.id,
                                         output_index=at, content_index=0,
                                         part=OutputText(text))),
            self._event(OutputItemEvent(type="response.output_item.done", sequence_number=0,
                                        output_index=at, item=message)),
        ]

    def _call(self, item: CallItem) -> list[bytes]:
        at = len(self.items)
        self.items.append(item)
        custom = isinstance(item, CustomToolCallItem)
        value = item.input if isinstance(item, CustomToolCallItem) else item.arguments
        opening = msgspec.structs.replace(item, status="in_progress", **(
            {"input": ""} if custom else {"arguments": ""}))
        delta = ArgumentsDeltaEvent(type="response.function_call_arguments.delta",
                                    item_id=item.id, output_index=at, delta=value)
        done = ArgumentsDoneEvent(type="response.function_call_arguments.done", item_id=item.id,
                                  output_index=at)
        if custom:
            delta.type, done.type = ("response.custom_tool_call_input.delta",
                                     "response.custom_tool_call_input.done")
        if custom:
            done.input = value
        else:
            done.arguments, done.name = value, item.name
        return [
            self._event(OutputItemEvent(type="response.output_item.added", sequence_number=0,
                                        output_index=at, item=opening)),
            self._event(delta),
            self._event(done),
            self._event(OutputItemEvent(type="response.output_item.done", sequence_number=0,
                                        output_index=at, item=item)),
        ]

    def finish(self, done: Finished) -> list[bytes]:
        """Closes the open item; response.completed, or response.incomplete at the cap."""
        capped = done.finish_reason == "length"
        out = [*self._close_reasoning(),
               *self._close_message("incomplete" if capped else "completed")]
        response = self.final(done)
        kind: LifecycleType = "response.incomplete" if capped else "response.completed"
        return [*out, self._lifecycle(kind, response)]

    def final(self, done: Finished) -> Response:
        capped = done.finish_reason == "length"
        reasoning_tokens = sum(
            self.count(part.text) for item in self.items
            if isinstance(item, ReasoningItem) for part in item.content or [])
        usage = ResponseUsage(done.prompt_tokens, done.completion_tokens,
                              done.prompt_tokens + done.completion_tokens,
                              output_tokens_details=OutputTokensDetails(reasoning_tokens))
        return msgspec.structs.replace(
            self.template, status="incomplete" if capped else "completed", output=self.items,
            usage=usage,
            incomplete_details=IncompleteDetails("max_output_tokens") if capped else None,
        )

    def fail(self, code: str, message: str) -> list[bytes]:
        """response.failed: the engine stopped mid-way (timeout, shutdown)."""
        out = self._close_reasoning() + self._close_message("incomplete")
        response = msgspec.structs.replace(self.template, status="failed", output=self.items,
                                           error=ResponseError(code, message))
        return [*out, self._lifecycle("response.failed", response)]
