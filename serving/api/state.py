"""What the API handlers share: settings, metrics, and the engine once the model is loaded."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from contract.settings import RankSettings
from serving.api.prompt_work import PromptWork
from serving.engine.engine import Engine
from serving.metrics import ServingMetrics


@dataclass
class ServedModel:
    tokenizer: Any  # mlx-lm TokenizerWrapper
    context_length: int
    vocab_size: int
    forced_output: list[int] = field(default_factory=list)  # rank_env.FORCED_OUTPUT's tokens


@dataclass
class ServingState:
    """Lives on app.state; the engine thread fills in model and engine when ready."""

    settings: RankSettings
    model_id: str
    world_size: int
    metrics: ServingMetrics
    status: str = "loading"  # loading -> ready -> stopping
    engine: Engine | None = None
    model: ServedModel | None = None
    created: int = 0
    launch_secret: str | None = None  # required on /v1 routes (api/launch_secret.py); None: open
    # Signs thinking blocks (api/thinking_signature.py): the cluster's, from rank 0's files.
    thinking_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    lock: threading.Lock = field(default_factory=threading.Lock)
    prompts: PromptWork = field(default_factory=PromptWork)  # tokenizing, off the loop

    @property
    def model_ids(self) -> frozenset[str]:
        """The names a request's `model` may give: the id and its aliases."""
        return frozenset([self.model_id, *self.settings.model.aliases])

    def set_ready(self, engine: Engine, model: ServedModel) -> None:
        with self.lock:
            self.engine, self.model = engine, model
            if self.status == "loading":
                self.status = "ready"
