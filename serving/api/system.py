"""GET /v1/models, /health and /metrics."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.datastructures import State
from prometheus_client import generate_latest

from contract.openai_schemas import ModelCard, ModelList
from serving.api.schemas import HealthBody
from serving.api.state import ServingState


class ModelsController(Controller):
    path = "/v1/models"

    @get("/")
    async def list_models(self, state: State) -> ModelList:
        serving: ServingState = state.serving
        return ModelList([ModelCard(serving.model_id, serving.created)])


class HealthController(Controller):
    path = "/health"

    @get("/")
    async def health(self, state: State) -> Response[HealthBody]:
        """200 when ready to serve; 503 while loading or stopping."""
        serving: ServingState = state.serving
        body = HealthBody(serving.status, serving.world_size, serving.model_id)
        return Response(body, status_code=200 if serving.status == "ready" else 503)


class MetricsController(Controller):
    path = "/metrics"

    @get("/")
    async def metrics(self, state: State) -> Response[bytes]:
        serving: ServingState = state.serving
        data = generate_latest(serving.metrics.registry)
        # Prometheus' text format; Litestar adds the charset (given twice, it doubles).
        return Response(data, media_type="text/plain; version=0.0.4")
