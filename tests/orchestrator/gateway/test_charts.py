"""The page's chart history: figures from successive scrapes, and a bounded buffer."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import msgspec
import pytest

from orchestrator.config import check_cluster_file
from orchestrator.gateway.charts import ChartHistory, ChartSample, InstancesSampler, Sampler
from orchestrator.gateway.live import live_events
from orchestrator.status.links import cluster_links, record_linktest
from orchestrator.status.model import ClusterStatus, InstanceStatus, NodeStatus
from orchestrator.supervision.progress import ServingSample
from testkit.orchestrator_process import write_cluster

GIB = 1024**3
INF = float("inf")


def metrics(tokens: float, running: int, ttft: list[tuple[float, float]]) -> ServingSample:
    """Rank 0's counters as the supervisor scraped them."""
    return ServingSample(generation_tokens=tokens, running=running, waiting=1, ttft_buckets=ttft)


def status(state: str = "ready", stale: bool = False) -> ClusterStatus:
    node = NodeStatus(name="a", transport="local", host="localhost", connected=True,
                      memory_total_bytes=16 * GIB, memory_available_bytes=10 * GIB,
                      usage_stale=stale)
    return ClusterStatus(cluster="c", state=state, api_url="u", model="m", backend="ring",
                         orchestrator_pid=1, nodes=[node])


def test_rates_and_windowed_ttft() -> None:
    """tokens/s between two scrapes; TTFT quantiles of the window's requests only; node
    memory in use; nothing from a gang that does not answer."""
    sampler = Sampler(ttft_window_s=30.0)
    old = [(0.1, 0.0), (1.0, 10.0), (INF, 10.0)]  # 10 slow first tokens, long ago
    first = sampler.sample(metrics(100, 2, old), status(), now=0.0, wall=1000.0)
    assert first.tokens_per_s is None and first.running == 2 and first.waiting == 1
    assert first.memory_used_bytes == {"a": 6 * GIB}
    later = [(0.1, 4.0), (1.0, 14.0), (INF, 14.0)]  # then 4 fast ones
    sampler.sample(metrics(130, 2, later), status(), now=3.0, wall=1003.0)
    past_window = sampler.sample(metrics(160, 2, later), status(), now=40.0, wall=1040.0)
    assert past_window.ttft_p50_s is None  # no first token in the last 30 s
    newest = [(0.1, 8.0), (1.0, 18.0), (INF, 18.0)]
    point = sampler.sample(metrics(190, 3, newest), status(), now=43.0, wall=1043.0)
    assert point.tokens_per_s == pytest.approx(10.0)
    assert point.ttft_p99_s is not None and point.ttft_p99_s <= 0.1  # the 4 fast ones only
    stale = metrics(190, 3, newest)  # the last gang's last scrape, still in the snapshot
    down = sampler.sample(stale, status("restarting", stale=True), now=46.0, wall=1046.0)
    assert down.state == "restarting" and down.running is None and down.memory_used_bytes == {}


def test_with_instances_each_has_its_own_figures_and_the_cluster_their_sum() -> None:
    """Per instance: its own rate, TTFT, requests and state; the cluster's tokens/s and
    requests summed over the instances that answered."""
    def parts(big: str) -> list[InstanceStatus]:
        return [InstanceStatus(name="big", model="m", state=big, restarts=1),
                InstanceStatus(name="small", model="s", state="ready")]

    sampler = InstancesSampler()
    fast = [(0.1, 2.0), (INF, 2.0)]
    slow = [(0.1, 0.0), (1.0, 2.0), (INF, 2.0)]
    sampler.sample({"big": metrics(0, 2, slow), "small": metrics(0, 1, fast)},
                   msgspec.structs.replace(status(), instances=parts("ready")), 0.0, 1000.0)
    more_fast, more_slow = [(0.1, 4.0), (INF, 4.0)], [(0.1, 0.0), (1.0, 4.0), (INF, 4.0)]
    point = sampler.sample({"big": metrics(30, 3, more_slow), "small": metrics(60, 1, more_fast)},
                           msgspec.structs.replace(status(), instances=parts("ready")),
                           3.0, 1003.0)
    big, small = point.instances["big"], point.instances["small"]
    assert (big.tokens_per_s, small.tokens_per_s, point.tokens_per_s) == (10.0, 20.0, 30.0)
    assert (big.running, small.running, point.running, point.waiting) == (3, 1, 4, 2)
    assert big.ttft_p50_s is not None and small.ttft_p50_s is not None
    assert big.ttft_p50_s > small.ttft_p50_s and big.restarts == 1
    down = sampler.sample({"big": metrics(90, 3, slow), "small": metrics(90, 1, fast)},
                          msgspec.structs.replace(status(), instances=parts("restarting")),
                          6.0, 1006.0)
    assert down.instances["big"].state == "restarting" and down.instances["big"].running is None
    assert down.tokens_per_s == 10.0 and down.running == 1


def test_a_restarted_rank_0_is_no_negative_rate() -> None:
    """Counters that went back (a new gang) give no rate below zero, and the TTFT window
    is the new histogram."""
    sampler = Sampler()
    sampler.sample(metrics(500, 0, [(1.0, 9.0), (INF, 9.0)]), status(), now=0.0, wall=0.0)
    point = sampler.sample(metrics(5, 1, [(1.0, 1.0), (INF, 1.0)]), status(), 3.0, 3.0)
    assert point.tokens_per_s == 0.0 and point.ttft_p50_s is not None


def test_history_is_bounded_and_feeds_watchers() -> None:
    """15 minutes of samples at most; a watcher that stops reading loses only its oldest."""
    history = ChartHistory(interval_s=3.0, window_s=900.0)

    async def run() -> list[float]:
        with history.watch() as queue:
            for t in range(400):
                history.add(ChartSample(t=float(t), state="ready"))
            assert history.watchers == 1
            return [queue.get_nowait().t for _ in range(queue.qsize())]

    kept = asyncio.run(run())
    assert len(history.samples) == 300 and history.samples[0].t == 100.0
    assert kept == [float(t) for t in range(384, 400)]
    assert history.watchers == 0


def test_cables_with_the_last_linktest(tmp_path: Path) -> None:
    """A ring of 3 has 3 cables; after a linktest each carries its slower direction's GB/s;
    JACCL's 3 nodes are a full mesh."""
    nodes = [{"name": f"n{i}", "ip": "127.0.0.1"} for i in range(3)]
    spec, _ = check_cluster_file(write_cluster(tmp_path, "bundled:smollm2-135m-instruct", nodes))
    assert [(link.a, link.b, link.gbs) for link in cluster_links(spec)] == [
        ("n0", "n1", None), ("n0", "n2", None), ("n1", "n2", None)]
    record_linktest(spec, [("n0", "n1", 1.5), ("n1", "n0", 1.25)])
    links = cluster_links(spec)
    assert (links[0].gbs, links[1].gbs) == (1.25, None) and links[0].measured_at


def test_live_events_history_then_samples_until_the_drain() -> None:
    """A watcher gets every kept sample first, then each new one; the stream ends once
    shutdown begins (an open page must not hold the graceful stop)."""
    history = ChartHistory(interval_s=3.0)
    history.add(ChartSample(t=1.0, state="ready"))

    class View:
        draining = False

    view = View()

    async def run() -> list[str]:
        events = live_events(history, view, history.new_watcher())  # type: ignore[arg-type]
        first = await anext(events)
        history.add(ChartSample(t=4.0, state="ready", running=2))
        second = await anext(events)
        view.draining = True
        rest = [message async for message in events]
        return [first.event or "", str(first.data), second.event or "", str(second.data),
                str(len(rest))]

    first, kept, second, sample, rest = asyncio.run(asyncio.wait_for(run(), 5.0))
    assert first == "history" and '"samples":[{"t":1.0' in kept
    assert second == "sample" and '"running":2' in sample and rest == "0"


def _three_nodes() -> ClusterStatus:
    nodes = [NodeStatus(name=f"studio-{i}", transport="ssh", host=f"10.0.0.{i}",
                        connected=True, memory_total_bytes=192 * GIB,
                        memory_available_bytes=(150 - i) * GIB) for i in range(3)]
    return ClusterStatus(cluster="c", state="ready", api_url="u", model="m", backend="ring",
                         orchestrator_pid=1, nodes=nodes)


def test_by_default_a_sample_every_3_s_kept_15_minutes_58_bytes_a_second() -> None:
    """The documented defaults: a sample every 3 s, 15 minutes of them (300), TTFT over
    30 s; one idle 3-node sample as its server-sent event, per 3 s: about 58 B/s a page."""
    from litestar.response import ServerSentEventMessage

    history = ChartHistory()
    assert (history.interval_s, history.window_s, history.samples.maxlen) == (3.0, 900.0, 300)
    sampler = Sampler()
    sampler.sample(metrics(100, 0, []), _three_nodes(), now=0.0, wall=1_764_279_000.0)
    point = sampler.sample(metrics(100, 0, []), _three_nodes(), now=3.0, wall=1_764_279_003.0)
    event = ServerSentEventMessage(event="sample", data=msgspec.json.encode(point).decode())
    per_second = len(event.encode()) / history.interval_s
    assert 58 * 0.8 <= per_second <= 58 * 1.2, (per_second, event.encode())


def test_the_sampling_loop_takes_a_sample_each_interval() -> None:
    """The gateway's lifespan hook samples at the history's interval (here 0.1 s), by the
    samples' own wall times."""
    from orchestrator.gateway.charts import sampling

    history = ChartHistory(interval_s=0.1, window_s=60.0)

    async def run() -> None:
        async with sampling(history, status, None)(None):
            await asyncio.sleep(0.65)

    asyncio.run(run())
    times = [s.t for s in history.samples]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 5 <= len(times) <= 8 and all(0.09 <= gap <= 0.3 for gap in gaps), gaps
