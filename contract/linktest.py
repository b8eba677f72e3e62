"""The link test's result: what rank 0 of `python -m serving.linktest` prints on one stdout
line and `orchestrator linktest` reads from its node agent's log events."""

from __future__ import annotations

import msgspec

RESULT_PREFIX = "LINKTEST_RESULT "


class Latency(msgspec.Struct):
    """all_sum of one value, many rounds."""

    p50_us: float
    p99_us: float


class BandwidthRow(msgspec.Struct):
    """all_sum of one size, best of a few rounds; bus GB/s as NCCL counts it."""

    bytes: int
    seconds: float
    algbw_gbs: float
    busbw_gbs: float


class LinkFigure(msgspec.Struct):
    """Rank `src` sending `bytes` to rank `dst` alone, timed by the receiver."""

    src: int
    dst: int
    bytes: int
    seconds: float
    gbs: float


class LinktestResult(msgspec.Struct):
    ranks: int
    correct: bool  # every rank's exact int32 sum was right
    latency: Latency
    bandwidth: list[BandwidthRow]
    links: list[LinkFigure]  # empty for one rank


def result_line(result: LinktestResult) -> str:
    return RESULT_PREFIX + msgspec.json.encode(result).decode()


def parse_result_line(line: str) -> LinktestResult | None:
    """The result a line carries, or None for any other line."""
    if not line.startswith(RESULT_PREFIX):
        return None
    return msgspec.json.decode(line.removeprefix(RESULT_PREFIX), type=LinktestResult)
