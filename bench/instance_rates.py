"""Aggregate tokens/s of servers under test, side by side, and the CPU each spends per
token (bench/instances.py)."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.loadgen.streams import chat_body, concurrent_streams  # noqa: E402

STORY = "Story {serial:06d}: write a long tale about a lighthouse keeper and a storm."


class Server:
    """One server under test: its URL, the model name it answers to, and the processes
    whose CPU time it spends (role -> pids: `rank` for the ones that run the model,
    `gateway` for the orchestrator in front of ours)."""

    def __init__(self, url: str, model: str, pids: dict[str, list[int]]) -> None:
        self.url, self.model, self.pids = url, model, pids

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system, every thread) each role's processes have used."""
        used = {}
        for role, pids in self.pids.items():
            times = [psutil.Process(pid).cpu_times() for pid in pids]
            used[role] = sum(t.user + t.system for t in times)
        return used


def rate(server: Server, level: int, tokens: int, serials: Iterator[int],
         ) -> tuple[float, dict[str, float]]:
    """Generated tokens per second of `level` concurrent streams, first send to last end,
    and each role's CPU seconds per generated token meanwhile."""
    bodies = [chat_body(server.model, STORY.format(serial=next(serials)), tokens, usage=True)
              for _ in range(level)]
    before = server.cpu_s()
    times, wall = concurrent_streams(server.url, bodies, timeout_s=600)
    after = server.cpu_s()
    if failed := [t.error for t in times if t.error]:
        raise RuntimeError(f"{len(failed)} of {level} streams to {server.url} failed: "
                           f"{failed[0]}")
    generated = sum(t.tokens for t in times)
    return generated / wall, {role: (after[role] - before[role]) / generated for role in after}


Rates = dict[int, dict[str, list[float]]]
CpuPerToken = dict[int, dict[str, list[dict[str, float]]]]


def measure_rates(servers: dict[str, Server], args: argparse.Namespace,
                  ) -> tuple[Rates, CpuPerToken]:
    """{level: {server: tokens/s per round}} and the CPU s per token of each, the servers'
    order rotating per round."""
    serials = iter(range(10**6))
    for server in servers.values():  # warm-up: compile, allocate, connect
        rate(server, 2, 8, serials)
    rates: Rates = {}
    cpu: CpuPerToken = {}
    turn = 0
    for level in args.levels:
        rates[level] = {name: [] for name in servers}
        cpu[level] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            turn += 1
            order = list(servers)[turn % len(servers):] + list(servers)[:turn % len(servers)]
            for name in order:
                tok_s, per_token = rate(servers[name], level, args.tokens, serials)
                rates[level][name].append(tok_s)
                cpu[level][name].append(per_token)
            print(f"  {level} streams, round {round_}: " + ", ".join(
                f"{n} {rates[level][n][-1]:.1f}" for n in servers) + " tok/s", flush=True)
    return rates, cpu


def ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))


def rate_summary(rates: Rates, cpu: CpuPerToken) -> dict[str, Any]:
    """Per level: each server's median tok/s and CPU s per token by role, and the ratios
    of `two` to every other server."""
    summary: dict[str, Any] = {}
    for level, by in rates.items():
        row: dict[str, Any] = {f"{n}_tok_s": statistics.median(r) for n, r in by.items()}
        row |= {f"two_over_{n}": ratio(by, "two", n) for n in by if n != "two"}
        row["cpu_s_per_token"] = {
            n: {role: statistics.median(c[role] for c in rounds) for role in rounds[0]}
            for n, rounds in cpu[level].items()}
        summary[str(level)] = row
    return summary
