"""Admission by KV budget: a sequence joins the batch only when its KV fits every rank.

A sequence may grow to its prompt plus its max_tokens; mlx-lm's batched cache pads every
sequence to the longest, in steps of 256 tokens (contract/kv_cache.py's batch_kv_bytes),
so a batch of n sequences costs n times its longest one, on each rank in proportion to
the layers and heads it holds. Rank 0 admits by it; every rank bounds its prefix cache by
what the running sequences leave (the prefix cache is evicted first), from the same plan
data and the same agreed numbers, so all ranks evict alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from contract.fingerprint import ModelConfigInfo
from contract.kv_cache import KvLayout, batch_kv_bytes, kv_bytes_per_token


class BeyondBudget(Exception):
    """The request cannot fit the KV budget even alone (HTTP 400)."""


def size(count: int) -> str:
    """Bytes for a message: GB for models, MB or bytes for small budgets (tests)."""
    if count >= 100_000_000:
        return f"{count / 1e9:.2f} GB"
    return f"{count / 1e6:.2f} MB" if count >= 100_000 else f"{count} bytes"


@dataclass(frozen=True)
class KvBudget:
    config: ModelConfigInfo
    layouts: list[KvLayout]  # indexed by rank
    budgets: list[int]  # bytes of KV each rank may hold, indexed by rank

    def batch_bytes(self, rank: int, needs: Iterable[int]) -> int:
        """KV bytes on `rank` of sequences that each grow to `needs[i]` tokens."""
        return batch_kv_bytes(self.config, self.layouts[rank], list(needs))

    def fits(self, needs: list[int]) -> bool:
        """Whether sequences growing to `needs` tokens fit every rank's budget together."""
        return all(
            self.batch_bytes(rank, needs) <= budget for rank, budget in enumerate(self.budgets)
        )

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request cannot run even alone, naming the budget and its need; None: it can."""
        need = prompt_tokens + max_tokens
        for rank, budget in enumerate(self.budgets):
            needed = self.batch_bytes(rank, [need])
            if needed > budget:
                return (
                    f"This request needs {size(needed)} of KV cache on rank {rank} "
                    f"({prompt_tokens} prompt tokens + {max_tokens} max_tokens = {need} "
                    f"tokens), beyond the KV budget of {size(budget)} "
                    f"(about {self.tokens_alone(rank)} tokens alone). Please reduce the "
                    "prompt or max_tokens."
                )
        return None

    def tokens_alone(self, rank: int) -> int:
        """Roughly the most tokens one sequence may grow to on `rank` (for messages)."""
        per_token = kv_bytes_per_token(self.config, self.layouts[rank])
        return self.budgets[rank] // per_token if per_token else 0

    def prefix_room(self, rank: int, needs: Iterable[int]) -> int:
        """Bytes `rank`'s prefix cache may hold beside the running sequences.

        Every rank computes it alike: the room left on the tightest rank, in tokens of
        per-token KV, scaled to this rank's per-token KV (an entry's bytes scale so)."""
        needs = list(needs)
        rooms = []
        for other, budget in enumerate(self.budgets):
            per_token = kv_bytes_per_token(self.config, self.layouts[other])
            if per_token:
                rooms.append(max(budget - self.batch_bytes(other, needs), 0) / per_token)
        if not rooms:
            return 0
        return int(min(rooms) * kv_bytes_per_token(self.config, self.layouts[rank]))

    def usage(self, needs: Iterable[int], prefix_bytes: int) -> list[int]:
        """KV bytes each rank holds or has promised: the running sequences at their full
        need, plus the prefix cache (`prefix_bytes` on rank 0, scaled to each rank)."""
        needs = list(needs)
        first = kv_bytes_per_token(self.config, self.layouts[0]) or 1
        return [
            self.batch_bytes(rank, needs)
            + prefix_bytes * kv_bytes_per_token(self.config, self.layouts[rank]) // first
            for rank in range(len(self.budgets))
        ]
