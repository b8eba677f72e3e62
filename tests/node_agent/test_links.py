"""The link watch's rule: when a link is down, and probes that overlap (no ranks, no
netns: scripted probes; tests/orchestrator/test_link_faults.py has the real links)."""

from __future__ import annotations

import asyncio

import pytest

from contract.agent_protocol import LinkState, LinkTarget, WatchLinks
from node_agent import links
from node_agent.links import LinkHealth

SYN_RETRANSMIT_S = 1.0  # TCP's first SYN retransmission, Linux and macOS


def verdicts(health: LinkHealth, script: str) -> list[str]:
    """Feed one verdict per character ('a' answered, 'm' missed), in start order; the
    changes it reported ('down' / 'up')."""
    changes = []
    for verdict in script:
        number = health.start()
        if verdict == "a" and health.answered(number):
            changes.append("up")
        if verdict == "m" and health.missed(number):
            changes.append("down")
    return changes


def test_single_misses_between_answers_never_take_the_link_down() -> None:
    """One lost probe now and then (a dropped packet) is ridden out, however often."""
    assert verdicts(LinkHealth(2), "amamamama") == []


def test_two_misses_in_a_row_take_it_down_once_and_an_answer_brings_it_back() -> None:
    """down_after misses in a row: down, reported once; the next answer: up."""
    health = LinkHealth(2)
    assert verdicts(health, "aammmma") == ["down", "up"]
    assert health.up
    assert verdicts(LinkHealth(3), "ammammma") == ["down", "up"]


def test_an_older_probes_late_miss_after_a_newer_answer_does_not_count() -> None:
    """Probes overlap: probe 2 answered before probe 1's window closed; probe 1's miss is
    old news, and with probe 3's miss it makes no two in a row."""
    health = LinkHealth(2)
    first, second, third = health.start(), health.start(), health.start()
    assert not health.answered(second)
    assert not health.missed(first)
    assert not health.missed(third)
    assert health.up


def test_the_answer_window_outlasts_the_first_syn_retransmission() -> None:
    """A probe whose SYN was lost is answered after its retransmission (1 s) plus a round
    trip through a full queue: the default window leaves it 0.4 s, so it is no miss."""
    assert WatchLinks().timeout_s >= SYN_RETRANSMIT_S + 0.4


async def test_probes_start_every_interval_even_while_one_waits_for_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each probe answers 0.35 s late (within its window): one still starts every 0.1 s,
    so a wide window does not slow the probing, and none is taken for a miss."""
    started: list[float] = []
    emitted: list[LinkState] = []
    loop = asyncio.get_running_loop()

    async def slow_probe(host: str, port: int, timeout_s: float) -> str | None:
        started.append(loop.time())
        await asyncio.sleep(0.35)
        return None

    async def emit(message: object) -> None:
        assert isinstance(message, LinkState)
        emitted.append(message)

    monkeypatch.setattr(links, "probe", slow_probe)
    probes = links.LinkProbes(emit)
    await probes.watch([LinkTarget(host="10.0.1.2", port=52101)], 0.1, 1.5, 2)
    await asyncio.sleep(0.55)
    await probes.close()
    assert len(started) >= 4, started  # one after the other, only 2 would have started
    assert emitted == []


SCALE = 0.25  # the simulated seconds below last a quarter of a real one
ROUND_TRIP_S = 0.1  # simulated: a SYN and its answer through a busy queue


class LossyLink:
    """A link as TCP's connect sees it, on a time scale: every packet in
    [lost_from, lost_until) (seconds since `start`) is dropped; a connect sends its SYN
    at once and again SYN_RETRANSMIT_S later, and is answered a round trip after the
    first that gets through."""

    def __init__(self, lost_from: float, lost_until: float) -> None:
        self.lost_from, self.lost_until = lost_from, lost_until
        self.start = asyncio.get_running_loop().time()

    def _lost(self, at: float) -> bool:
        return self.lost_from <= (at - self.start) / SCALE < self.lost_until

    async def probe(self, host: str, port: int, timeout_s: float) -> str | None:
        sent = asyncio.get_running_loop().time()
        tries = (sent, sent + SYN_RETRANSMIT_S * SCALE)
        through = next((at - sent for at in tries if not self._lost(at)), float("inf"))
        answer_in = through + ROUND_TRIP_S * SCALE
        if answer_in > timeout_s:
            await asyncio.sleep(timeout_s)
            return f"no answer within {timeout_s / SCALE:g} s"
        await asyncio.sleep(answer_in)
        return None


async def watch_through(link: LossyLink, monkeypatch: pytest.MonkeyPatch,
                        seconds: float) -> list[tuple[bool, float]]:
    """The default watch over `link` for `seconds` (scaled): each change and when."""
    changes: list[tuple[bool, float]] = []

    async def emit(message: object) -> None:
        assert isinstance(message, LinkState)
        changes.append((message.up, (asyncio.get_running_loop().time() - link.start) / SCALE))

    monkeypatch.setattr(links, "probe", link.probe)
    probes, defaults = links.LinkProbes(emit), WatchLinks()
    await probes.watch([LinkTarget(host="10.0.1.2", port=52101)], defaults.interval_s * SCALE,
                       defaults.timeout_s * SCALE, defaults.down_after)
    await asyncio.sleep(seconds * SCALE)
    await probes.close()
    return changes


async def test_a_loss_of_1_8_s_is_ridden_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """All packets lost for 1.8 s: the probe whose SYN and retransmission both fell in it
    misses, the next one's retransmission gets through: no link_down. (One probe after
    the other with 1 s each, both missed: down, and the gang restarted for nothing.)"""
    link = LossyLink(lost_from=0.5, lost_until=2.3)
    assert await watch_through(link, monkeypatch, 4.5) == []


async def test_a_dead_link_is_down_within_3_5_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything lost from 0.5 s on: down, once, by 0.5 + 3.5 s (the last answer's next
    probe, then two missed windows)."""
    link = LossyLink(lost_from=0.5, lost_until=float("inf"))
    changes = await watch_through(link, monkeypatch, 4.5)
    assert [up for up, _ in changes] == [False], changes
    assert changes[0][1] <= 0.5 + 3.5 + 0.2, changes  # 0.2: the event loop's slack
