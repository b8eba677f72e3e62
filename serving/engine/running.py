"""One admitted request on rank 0: streaming detokenization, stop strings, per-request metrics."""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from serving.engine.requests import Finished, GenerationRequest, TextDelta, TokenLogprob
from serving.metrics import ServingMetrics


class RunningRequest:
    """Turns the request's tokens into text deltas and a final Finished event."""

    def __init__(self, request: GenerationRequest, tokenizer: Any, metrics: ServingMetrics) -> None:
        self.request = request
        self.done = False  # finished on rank 0 (stop string): the engine removes it next step
        self._metrics = metrics
        self._detokenizer = tokenizer.detokenizer
        self._text = ""
        self._sent = 0  # chars of _text already pushed to the client
        self._longest_stop = max((len(s) for s in request.stop), default=0)
        self._completion_tokens = 0
        self._last_token_at: float | None = None
        self._joined_at = time.monotonic()  # prefill starts with the step that inserts it
        self._first_token_at: float | None = None
        self._logprobs: list[TokenLogprob] = []  # of tokens whose text is not sent yet

    @property
    def started(self) -> bool:
        """Its prompt is prefilled: it has had its first token."""
        return self._completion_tokens > 0

    def on_token(self, token: int, finish_reason: str | None, logprobs: mx.array | None) -> None:
        if self.done:
            return
        self._observe_timing()
        self._completion_tokens += 1
        if finish_reason != "stop":  # "stop" from the generator means an EOS token: no text
            if self.request.top_logprobs is not None and logprobs is not None:
                self._logprobs.append(token_logprob(token, logprobs, self.request.top_logprobs))
            self._detokenizer.add_token(token)
            self._text += self._detokenizer.last_segment
        if finish_reason is not None:
            self._detokenizer.finalize()
            self._text += self._detokenizer.last_segment
        stop_at = self._find_stop()
        if stop_at is not None:
            self._finish("stop", stop_at)
        elif finish_reason is not None:
            self._finish(finish_reason, len(self._text))
        else:
            self._flush(len(self._text) - max(self._longest_stop - 1, 0))

    def _observe_timing(self) -> None:
        now = time.monotonic()
        if self._last_token_at is None:
            self._first_token_at = now
            self._metrics.time_to_first_token.observe(now - self.request.created)
        else:
            self._metrics.inter_token_latency.observe(now - self._last_token_at)
        self._last_token_at = now
        self._metrics.generation_tokens.inc()

    def _find_stop(self) -> int | None:
        """Index of the earliest stop string in the text not yet sent, if any."""
        if not self.request.stop:
            return None
        start = max(self._sent - self._longest_stop, 0)
        hits = [i for i in (self._text.find(s, start) for s in self.request.stop) if i >= 0]
        return min(hits) if hits else None

    def _flush(self, upto: int) -> None:
        if upto > self._sent:
            self.request.sink.push(TextDelta(self._text[self._sent : upto], tuple(self._logprobs)))
            self._sent = upto
            self._logprobs = []

    def _finish(self, reason: str, upto: int) -> None:
        self._flush(upto)
        self.done = True
        now = time.monotonic()
        first = self._first_token_at or now
        stop = next((s for s in self.request.stop if self._text.startswith(s, upto)), None)
        usage = Finished(
            reason, len(self.request.prompt), self._completion_tokens,
            stop if reason == "stop" else None, first - self._joined_at, now - first,
        )
        self.request.sink.push(usage)
        self._metrics.e2e_latency.observe(now - self.request.created)
        self._metrics.requests_finished.labels(finish_reason=reason).inc()


def token_logprob(token: int, logprobs: mx.array, top: int) -> TokenLogprob:
    """The token's log probability and the `top` most likely tokens, best first."""
    chosen = float(logprobs[token].item())  # type: ignore[arg-type]
    if top <= 0:
        return TokenLogprob(token, chosen)
    ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
    ranked: list[tuple[int, float]] = sorted(
        zip(ids.tolist(), logprobs[ids].tolist(), strict=True),  # type: ignore[arg-type]
        key=lambda pair: -pair[1],
    )
    return TokenLogprob(token, chosen, tuple((int(i), float(v)) for i, v in ranked))
