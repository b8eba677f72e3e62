"""The gateway's counters per instance, and the resend of a request lost with a replica:
at once and batched when the failure is no request's doing, alone when it could be.

Each replica is a FakeView with a fake rank 0 of its own (a real HTTP server); the gateway
is the real app with a real router, as `up` builds it for [[instances]]."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.gateway import app as gateway_app
from orchestrator.gateway.quarantine import could_be_the_request
from orchestrator.gateway.routing import ModelRoute, ModelRouter, Replica
from orchestrator.instance_metrics import merge_registries
from orchestrator.supervision.failures import Cause, RankFailure
from orchestrator.supervision.metrics import GatewayCounters, OrchestratorMetrics
from orchestrator.supervision.state import GangState
from testkit.fake_rank0 import FakeView, Handler, fake_rank0, sse, status
from testkit.raw_http import on_uvicorn

KILLED = RankFailure(Cause.RANK_CRASHED, "n", 0, "SIGKILL", 0.0, signal="SIGKILL")
DESYNC = RankFailure(Cause.DESYNC, "n", 0, "desync", 0.0, exit_code=75)


def ok(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":  # rank 0's own families: none here
        return httpx.Response(200, text="")
    return httpx.Response(200, json={"served_by": request.url.host})


def cut(request: httpx.Request) -> httpx.Response:
    """Rank 0 dies with the request taken: the connection ends before a byte of it."""
    return sse(cut=True)


@dataclass
class Gateway:
    app: Litestar
    client: AsyncTestClient  # type: ignore[type-arg]
    views: dict[str, FakeView]
    metrics: dict[str, OrchestratorMetrics]  # by instance
    unrouted: GatewayCounters
    served: OrchestratorMetrics  # renders /metrics


@pytest.fixture
def instances() -> Iterator[object]:
    """(handlers by instance name, {model: [instance names]}) -> Gateway, each instance a
    FakeView of launch `<name>1` with a fake rank 0 of its own."""
    with contextlib.ExitStack() as servers:

        def make(handlers: dict[str, Handler], models: dict[str, list[str]]) -> Gateway:
            views, metrics = {}, {}
            for name, handler in handlers.items():
                views[name] = FakeView()
                views[name].launch = f"{name}1"
                views[name].base_url = servers.enter_context(fake_rank0(handler))
                metrics[name] = OrchestratorMetrics()
            routes = [ModelRoute(model, [Replica(n, views[n], metrics[n]) for n in names])
                      for model, names in models.items()]
            everything = ModelRoute("", [Replica(n, v) for n, v in views.items()])
            unrouted, served = GatewayCounters(CollectorRegistry()), metrics["a"]
            served.expose(merge_registries(
                {"": unrouted.registry, **{n: m.registry for n, m in metrics.items()}}))
            app = gateway_app.create_app(
                everything, status, served, api_key=None, request_timeout_s=5.0,
                router=ModelRouter(routes, {}), counters=unrouted)
            return Gateway(app, AsyncTestClient(app=app), views, metrics, unrouted, served)

        yield make


def sample_value(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The value of the sample `name` with exactly `labels` in a Prometheus text."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def answers(counters: GatewayCounters, code: str) -> float:
    return counters.registry.get_sample_value(
        "orchestrator_responses_total", {"status": code}) or 0.0


async def test_each_request_is_booked_under_the_instance_that_served_it(
    instances: object,
) -> None:
    """Answers go to the serving instance's counters (labelled model_instance in /metrics);
    an unknown model's 404 to the gateway's own, served without the label."""
    gateway = instances({"a": ok, "b": ok, "s": ok}, {"m": ["a", "b"], "small": ["s"]})  # type: ignore[operator]
    async with gateway.client as client:
        assert (await client.post("/v1/chat/completions", json=chat("m"))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat("small"))).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat("x"))).status_code == 404
        text = (await client.get("/metrics")).text
    a, b, s = (gateway.metrics[n] for n in "abs")
    assert (answers(a, "200"), answers(b, "200"), answers(s, "200")) == (1, 0, 1)
    assert [answers(m, "404") for m in (a, b, s)] == [0, 0, 0]
    assert answers(gateway.unrouted, "404") == 1
    assert sample_value(text, "orchestrator_responses_total",
                        {"status": "200", "model_instance": "s"}) == 1
    assert sample_value(text, "orchestrator_responses_total", {"status": "404"}) == 1


async def test_a_request_lost_with_a_killed_replica_is_booked_under_both(
    instances: object,
) -> None:
    """The resend is booked under the replica that lost it, the answer under the one that
    served it."""
    gateway = instances({"a": cut, "b": ok}, {"m": ["a", "b"]})  # type: ignore[operator]
    gateway.views["a"].failures["a1"] = KILLED
    async with gateway.client as client:
        reply = await client.post("/v1/chat/completions", json=chat("m"))
    assert reply.status_code == 200 and reply.json()["served_by"] == "rank0-b1"
    a, b = gateway.metrics["a"], gateway.metrics["b"]
    assert a.registry.get_sample_value("orchestrator_requests_retried_total") == 1
    assert (answers(a, "200"), answers(b, "200")) == (0, 1)


def held(release: threading.Event) -> Handler:
    """Rank 0 busy with a request: it answers once `release` is set."""

    def handler(request: httpx.Request) -> httpx.Response:
        release.wait(10)
        return ok(request)

    return handler


@pytest.mark.parametrize(("failure", "waits"), [(KILLED, False), (DESYNC, True), (None, True)])
async def test_a_lost_request_waits_for_isolation_only_if_it_could_be_the_cause(
    instances: object, failure: RankFailure | None, waits: bool,
) -> None:
    """A request that was at a replica killed from outside is resent at once beside the
    other replicas' work; after a desync (or an unknown cause) it waits to run alone."""
    release = threading.Event()
    gateway = instances({"a": cut, "b": ok, "c": held(release)}, {"m": ["a", "b", "c"]})  # type: ignore[operator]
    views = gateway.views
    if failure is not None:
        views["a"].failures["a1"] = failure
    views["a"].to(GangState.RESTARTING)
    views["b"].to(GangState.RESTARTING)
    # A real server: Litestar's test client does not run requests side by side.
    with on_uvicorn(gateway.app) as (host, port):
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as client:
            busy = asyncio.create_task(client.post("/v1/chat/completions", json=chat("m")))
            await asyncio.sleep(0.3)  # at c, held there
            views["a"].to(GangState.READY)
            views["b"].to(GangState.READY)
            lost = asyncio.create_task(client.post("/v1/chat/completions", json=chat("m")))
            done, _ = await asyncio.wait({lost}, timeout=1.0)
            release.set()
            assert (await busy).status_code == 200
            reply = await lost
    assert reply.status_code == 200
    assert bool(done) is not waits


async def test_killed_twice_is_answered_with_an_error_not_resent_forever(
    instances: object,
) -> None:
    """Two gangs lost with the request, even killed from outside: a 500, at most 2
    restarts spent on it (booked under the replica that lost it last)."""
    gateway = instances({"a": cut, "b": cut}, {"m": ["a", "b"]})  # type: ignore[operator]
    gateway.views["a"].failures["a1"] = KILLED
    gateway.views["b"].failures["b1"] = KILLED
    async with gateway.client as client:
        reply = await client.post("/v1/chat/completions", json=chat("m"))
    assert reply.status_code == 500, reply.text
    assert reply.json()["error"]["code"] == "request_crashed_server"
    assert "stopped from outside" in reply.json()["error"]["message"]
    b = gateway.metrics["b"]
    assert b.registry.get_sample_value("orchestrator_requests_quarantined_total") == 1
    assert answers(b, "500") == 1


@pytest.mark.parametrize(("failure", "suspect"), [
    (KILLED, False),
    (RankFailure(Cause.RANK_CRASHED, "n", 0, "SIGTERM", 0.0, signal="SIGTERM"), False),
    (RankFailure(Cause.AGENT_LOST, "n", None, "agent gone", 0.0), False),
    (RankFailure(Cause.LINK_DOWN, "n", None, "link", 0.0), False),
    (RankFailure(Cause.RANK_CRASHED, "n", 0, "SIGSEGV", 0.0, signal="SIGSEGV"), True),
    (RankFailure(Cause.RANK_CRASHED, "n", 0, "exit 1", 0.0, exit_code=1), True),
    (RankFailure(Cause.OOM, "n", 0, "SIGKILL", 0.0, signal="SIGKILL"), True),
    (DESYNC, True),
    (RankFailure(Cause.HANG, "n", 0, "no step", 0.0), True),
    (RankFailure(Cause.PEER_LOST, "n", 1, "peer", 0.0, exit_code=76), True),
    (None, True),
])
def test_which_failures_could_be_a_requests_doing(
    failure: RankFailure | None, suspect: bool,
) -> None:
    """A signal from outside, a lost node or link: not the request; anything else, or an
    unknown cause: maybe."""
    assert could_be_the_request(failure) is suspect
