"""Routing by model: id and alias, least work among ready replicas, unknown models."""

from __future__ import annotations

import asyncio

import pytest

from contract.openai_errors import ApiError
from orchestrator.gateway.routing import ModelRoute, ModelRouter, Replica, model_of
from orchestrator.supervision.snapshot import Upstream
from orchestrator.supervision.state import GangState


class View:
    """A replica's view as the gateway reads it: a state and a launch."""

    def __init__(self, launch: str, state: GangState = GangState.READY) -> None:
        self.launch, self.state, self.reason, self.draining = launch, state, "", False
        self.changed = asyncio.Event()

    def wake_workers(self) -> None:
        pass

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        try:
            async with asyncio.timeout(timeout_s):
                while self.state != GangState.READY or self.launch == not_launch:
                    await self.changed.wait()
                    self.changed.clear()
        except TimeoutError:
            return None
        return Upstream(f"http://{self.launch}", self.launch)


def test_least_work_ready_replica_is_chosen() -> None:
    """The replica with fewer requests in flight wins; a restarting one is skipped."""
    a, b, c = View("a"), View("b"), View("c", GangState.RESTARTING)
    route = ModelRoute("m", [Replica("a", a), Replica("b", b), Replica("c", c)])

    async def choose() -> str:
        upstream = await route.wait_for_upstream(1.0)
        assert upstream is not None
        return upstream.launch_id

    assert asyncio.run(choose()) == "a"  # a tie: the first
    route.in_flight["a"] = 2
    route.in_flight["b"] = 1
    assert asyncio.run(choose()) == "b"
    route.in_flight["b"] = 3
    assert asyncio.run(choose()) == "a"  # c has none, but is not ready


def test_a_resend_goes_to_another_replica_and_waits_for_one() -> None:
    """not_launch steers a resend away from the replica that lost it; with none ready the
    route waits for the first that becomes ready."""
    a, b = View("a"), View("b", GangState.RESTARTING)
    route = ModelRoute("m", [Replica("a", a), Replica("b", b)])

    async def scenario() -> str | None:
        later = asyncio.ensure_future(route.wait_for_upstream(5.0, not_launch="a"))
        await asyncio.sleep(0.05)
        assert not later.done()
        b.state = GangState.READY
        b.changed.set()
        upstream = await later
        return upstream.launch_id if upstream else None

    a.state = GangState.RESTARTING
    assert asyncio.run(scenario()) == "b"
    assert route.state == GangState.READY  # b serves while a restarts
    b.state = GangState.FAILED
    a.state = GangState.RESTARTING
    assert route.state != GangState.READY and "b: failed" in route.reason


def test_router_by_id_and_alias_and_unknown_models() -> None:
    """Ids and aliases name a route; an unknown model is a 404 listing the ids."""
    big, small = ModelRoute("big", []), ModelRoute("small", [])
    router = ModelRouter([big, small], {"claude-haiku-4-5": "small"})
    assert router.route("big") is big and router.route("claude-haiku-4-5") is small
    with pytest.raises(ApiError) as unknown:
        router.route("gpt-5")
    assert unknown.value.status == 404 and "big, small" in str(unknown.value.body)
    assert router.ids == ["big", "small"]
    one = ModelRouter([big], {})
    assert one.route("anything") is big  # one model: rank 0 judges the name, as before


def test_model_of_reads_the_body() -> None:
    """The model a body names, or None for none and for malformed JSON."""
    assert model_of(b'{"model": "x", "messages": []}') == "x"
    assert model_of(b"{}") is None and model_of(b"not json") is None
