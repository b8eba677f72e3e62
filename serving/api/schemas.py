"""/health's body (the OpenAI bodies are in contract/openai_schemas.py)."""

from __future__ import annotations

import msgspec


class HealthBody(msgspec.Struct):
    status: str  # "loading" | "ready" | "stopping"
    rank_count: int
    model: str
