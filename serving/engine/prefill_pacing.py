"""How many prompt tokens each engine step prefills, so a long prompt never stalls streams.

mlx-lm's BatchGenerator decodes the running batch, then prefills one chunk of every
waiting prompt, in the same step: the running streams' next token waits for that chunk.
With a fixed chunk (512 tokens) a long prompt stretched their inter-token latency from
0.09 s to 4.4 s on this project's 2-core CI machine. Rank 0 therefore sizes each step's
chunk from what it measures: the time of a decode-only step, and what each prefilled
token adds to a step, so that a step with prefill lasts about `max_slowdown` decode-only
steps. What a token adds is taken from the whole step, not from mlx-lm's prefill timer
alone: the streams wait for the whole step, and any chunk adds a forward pass over the
weights and the KV cache (at 1 rank here about a decode step, whatever its size). With no
stream decoding, the prompt gets the whole `max_chunk` (its time to first token is all
that matters then). The chunk travels in the StepPlan, so every rank prefills alike.
"""

from __future__ import annotations

MIN_CHUNK = 16  # below this, a matmul's fixed costs dominate and prefill crawls
SMOOTHING = 0.3  # weight of the newest measurement in the running averages


class PrefillPacer:
    def __init__(self, max_chunk: int, max_slowdown: float) -> None:
        self.max_chunk = max_chunk
        self.min_chunk = min(MIN_CHUNK, max_chunk)
        self.max_slowdown = max_slowdown  # 0: off, every chunk is max_chunk
        self.decode_step_s: float | None = None  # a step that only decodes
        self.token_s: float | None = None  # seconds a prompt token adds to a step

    def chunk(self, decoding: int, prefilling: int) -> int:
        """Prompt tokens per prefilling sequence in the next step."""
        if not (decoding and prefilling) or self.max_slowdown <= 1:
            return self.max_chunk
        if self.decode_step_s is None or self.token_s is None:
            return self.min_chunk  # measure before committing to more
        budget_s = (self.max_slowdown - 1) * self.decode_step_s
        per_sequence = int(budget_s / self.token_s) // prefilling
        return max(self.min_chunk, min(per_sequence, self.max_chunk))

    def observe(self, step_s: float, prompt_tokens: int, prompt_s: float) -> None:
        """One finished step: its wall time and the prefill inside it (mlx-lm's counters)."""
        if prompt_tokens:
            added_s = max(step_s - (self.decode_step_s or 0.0), prompt_s)
            self.token_s = _average(self.token_s, added_s / prompt_tokens)
        else:
            self.decode_step_s = _average(self.decode_step_s, step_s)


def _average(current: float | None, new: float) -> float:
    return new if current is None else current + SMOOTHING * (new - current)
