"""create_app(): rank 0's internal API (OpenAI's chat, completions and Responses;
Anthropic's Messages)."""

from __future__ import annotations

from litestar import Litestar, Router
from litestar.datastructures import State

from serving.api.chat import ChatController
from serving.api.completions import CompletionsController
from serving.api.errors import EXCEPTION_HANDLERS
from serving.api.launch_secret import require_launch_secret
from serving.api.messages import MessagesController
from serving.api.responses import ResponsesController
from serving.api.state import ServingState
from serving.api.system import HealthController, MetricsController, ModelsController


def create_app(serving: ServingState) -> Litestar:
    return Litestar(
        route_handlers=[
            Router(
                "/",
                route_handlers=[
                    ChatController, CompletionsController, MessagesController, ResponsesController,
                    ModelsController,
                ],
                guards=[require_launch_secret],
            ),
            HealthController, MetricsController,
        ],
        state=State({"serving": serving}),
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        request_max_body_size=serving.settings.serving.max_body_bytes,
        openapi_config=None,
        logging_config=None,
    )
