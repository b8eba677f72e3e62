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
