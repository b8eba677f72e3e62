"""Rank 0's /v1 routes refuse a request without the launch's secret, before any handler
runs; /health and /metrics stay open (serving/api/launch_secret.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from contract.launch_secret import HEADER, LaunchSecretError, read_secret_file, secret_matches
from contract.settings import ModelSettings, RankSettings
from serving.api.app import create_app
from serving.api.state import ServingState
from serving.metrics import ServingMetrics

SECRET = "s-" + "x" * 41
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def client(secret: str | None) -> AsyncTestClient:  # type: ignore[type-arg]
    settings = RankSettings(model=ModelSettings(path="m"))
    state = ServingState(settings, "m", 1, ServingMetrics(), launch_secret=secret)
    return AsyncTestClient(app=create_app(state))


async def test_v1_routes_refuse_a_missing_or_wrong_secret_with_a_401() -> None:
    """No header or another secret: 401 in OpenAI's shape (Anthropic's on /v1/messages)."""
    async with client(SECRET) as c:
        for headers in ({}, {HEADER: "wrong"}, {HEADER: SECRET + "x"}, {HEADER: ""}):
            models = await c.get("/v1/models", headers=headers)
            chat = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            messages = await c.post("/v1/messages", json=CHAT, headers=headers)
            assert models.status_code == chat.status_code == messages.status_code == 401
            error = chat.json()["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
            assert HEADER in error["message"] and SECRET not in error["message"]
            assert messages.json()["error"]["type"] == "authentication_error"


async def test_the_right_secret_passes_to_the_handlers() -> None:
    """With the secret: /v1/models answers; a completion reaches its handler, which says
    the model is still loading (503): the guard ran first and let it through."""
    async with client(SECRET) as c:
        models = await c.get("/v1/models", headers={HEADER: SECRET})
        chat = await c.post("/v1/chat/completions", json=CHAT, headers={HEADER: SECRET})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "m"
    assert chat.status_code == 503


async def test_health_and_metrics_need_no_secret() -> None:
    """They generate nothing, and the supervisor polls them (as the gateway's are open)."""
    async with client(SECRET) as c:
        assert (await c.get("/health")).status_code == 503  # loading, not 401
        assert (await c.get("/metrics")).status_code == 200


async def test_a_rank_without_a_secret_is_open() -> None:
    """A rank started by hand (no api_secret_file) serves without one, as before."""
    async with client(None) as c:
        assert (await c.get("/v1/models")).status_code == 200


def test_the_secret_file_is_read_stripped_and_must_hold_something(tmp_path: Path) -> None:
    """A trailing newline is not part of it; an empty or missing file is an error naming it."""
    path = tmp_path / "launch_secret"
    path.write_text(SECRET + "\n")
    assert read_secret_file(path) == SECRET
    path.write_text("\n")
    with pytest.raises(LaunchSecretError, match="is empty"):
        read_secret_file(path)
    with pytest.raises(LaunchSecretError, match="cannot read"):
        read_secret_file(tmp_path / "absent")


def test_secret_matches_only_the_same_secret() -> None:
    assert secret_matches(SECRET, SECRET)
    assert not secret_matches(None, SECRET)
    assert not secret_matches(SECRET[:-1], SECRET)
    assert not secret_matches("é", SECRET)  # non-ASCII compares too, without TypeError
