"""`orchestrator linktest cluster.toml`: measure the links between the nodes before serving.

    connect every node ─▶ reachability of every hop (seconds; names a dead cable)
      ─▶ one `python -m serving.linktest` per node, with a launch's environment
      ─▶ correctness, latency, all_sum bandwidth sweep, and GB/s per ring link
      ─▶ a table (or --json); exit 1 when a sum is wrong or a link is below --min-gbps

Refused while the cluster is serving (its ranks hold the ports and the devices), unless
--force.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import msgspec
from rich.table import Table

from contract.agent_protocol import Event, Exited, Log
from contract.linktest import BandwidthRow, Latency, LinktestResult, parse_result_line
from orchestrator.config import ClusterSpec
from orchestrator.config.links import cable_labels
from orchestrator.console import report_console
from orchestrator.launch.gang import Gang
from orchestrator.launch.plan import LaunchPlan, build_plan, new_launch_id
from orchestrator.launch.reachability import LinkChecks, link_table
from orchestrator.state_file import orchestrator_alive, read_state, state_path
from orchestrator.status.links import record_linktest
from orchestrator.transports.pool import NodePool

EXIT_OK, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 2


@dataclass
class Run:
    """What the agents report while the test runs."""

    result: LinktestResult | None = None
    exits: dict[int, Exited] = field(default_factory=dict)
    stderr: list[str] = field(default_factory=list)
    gang: Gang | None = None

    def on_event(self, node: str, event: Event) -> None:
        result = parse_result_line(event.line) if isinstance(event, Log) else None
        if result is not None:
            self.result = result
        elif isinstance(event, Log) and event.stream == "stderr":
            self.stderr.append(f"[{node} r{event.rank}] {event.line}")
        elif isinstance(event, Exited) and self.gang and self.gang.note_exit(event):
            self.exits[event.rank] = event


def linktest(
    spec: ClusterSpec, *, force: bool, min_gbps: float, as_json: bool, timeout_s: float
) -> int:
    state = read_state(state_path(spec))
    if state is not None and orchestrator_alive(state) and not force:
        print(
            f"{spec.cluster.name} is serving (orchestrator pid {state.orchestrator_pid}): its "
            "ranks hold the ports and devices. `orchestrator down` first, or --force"
        )
        return EXIT_NOT_RUN
    return asyncio.run(_linktest(spec, min_gbps, as_json, timeout_s))


async def _linktest(spec: ClusterSpec, min_gbps: float, as_json: bool, timeout_s: float) -> int:
    run = Run()
    pool = NodePool(spec, on_event=run.on_event, on_lost=lambda node, info: None)
    try:
        errors = await pool.connect_all()
        for error in errors:
            print(f"cannot reach node {error.node} ({error.kind}): {error.message}")
        if errors:
            return EXIT_NOT_RUN
        unreachable = await LinkChecks(spec, pool).check()
        if unreachable:
            print("links between ranks do not answer:\n" + link_table(unreachable))
            return EXIT_FAILED
        await _run_ranks(spec, pool, run, timeout_s)
    finally:
        await pool.close_all()
    if run.result is None:
        codes = {rank: e.signal or e.returncode for rank, e in sorted(run.exits.items())}
        tail = "\n".join(run.stderr[-20:])
        print(f"linktest did not finish (rank exits: {codes or 'none'}):\n{tail}")
        return EXIT_FAILED
    report = LinkReport(spec, run.result, min_gbps)
    # the status page draws each cable's GB/s
    record_linktest(spec, [(link.from_, link.to, link.gbs) for link in report.links])
    if as_json:
        print(json.dumps(msgspec.to_builtins(report.summary()), indent=2))
    else:
        report.print()
    return EXIT_OK if report.passed else EXIT_FAILED


def _plan(spec: ClusterSpec, timeout_s: float) -> LaunchPlan:
    """A launch's plan (env, hostfile, cwd) with the link test as the program."""
    plan = build_plan(spec, "linktest-" + new_launch_id())
    program = ["-m", "serving.linktest", "--timeout-s", f"{timeout_s:g}"]
    ranks = [
        msgspec.structs.replace(launch, argv=[node.python_executable, *program])
        for launch, node in zip(plan.ranks, spec.nodes, strict=True)
    ]
    return msgspec.structs.replace(plan, ranks=ranks)


async def _run_ranks(spec: ClusterSpec, pool: NodePool, run: Run, timeout_s: float) -> None:
    gang = run.gang = Gang(_plan(spec, timeout_s), pool)
    failed = await gang.start()
    for failure in failed:
        print(f"rank {failure.rank} on {failure.node} did not start: {failure.message}")
    deadline = time.monotonic() + timeout_s + 10.0  # the ranks end themselves at timeout_s
    while not failed and len(run.exits) < spec.world_size and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await gang.stop(2.0)


class NamedLink(msgspec.Struct, kw_only=True):
    """One link's figures, named by node and address, judged against --min-gbps."""

    src: int
    dst: int
    bytes: int
    seconds: float
    gbs: float
    from_: str = msgspec.field(name="from")
    to: str
    address: str
    gbits: float
    ok: bool


class LinkSummary(msgspec.Struct):
    """`linktest --json`: the result, its links named and judged, and the verdict."""

    ranks: int
    correct: bool
    latency: Latency
    bandwidth: list[BandwidthRow]
    links: list[NamedLink]
    min_gbps: float
    passed: bool


class LinkReport:
    """The figures of one run, named by node and address, judged against --min-gbps."""

    def __init__(self, spec: ClusterSpec, result: LinktestResult, min_gbps: float) -> None:
        self.spec, self.result, self.min_gbps = spec, result, min_gbps
        names = [node.name for node in spec.nodes]
        addresses = cable_labels(spec)  # ring: the address; jaccl: the devices
        self.links = [
            NamedLink(
                **msgspec.structs.asdict(link),
                from_=names[link.src],
                to=names[link.dst],
                address=addresses.get(link.dst, ""),
                gbits=link.gbs * 8,
                ok=link.gbs * 8 >= min_gbps,
            )
            for link in result.links
        ]

    @property
    def passed(self) -> bool:
        return self.result.correct and all(link.ok for link in self.links)

    def summary(self) -> LinkSummary:
        r = self.result
        return LinkSummary(
            r.ranks, r.correct, r.latency, r.bandwidth, self.links, self.min_gbps, self.passed
        )

    def print(self) -> None:
        console = report_console()
        latency = self.result.latency
        console.print(
            f"{self.spec.cluster.name}: {self.result.ranks} ranks, "
            f"{self.spec.cluster.backend} backend; all_sum "
            + ("[green]correct[/]" if self.result.correct else "[red]WRONG[/]")
            + f"; latency p50 {latency.p50_us:.0f} µs, p99 {latency.p99_us:.0f} µs"
        )
        sweep = Table(title="all_sum bandwidth", title_justify="left")
        for column in ("size", "time", "algbw GB/s", "busbw GB/s"):
            sweep.add_column(column, justify="right")
        for row in self.result.bandwidth:
            sweep.add_row(_size(row.bytes), f"{row.seconds * 1e3:.2f} ms",
                          f"{row.algbw_gbs:.3f}", f"{row.busbw_gbs:.3f}")
        console.print(sweep)
        if self.links:
            console.print(self._links_table())

    def _links_table(self) -> Table:
        table = Table(title="links (one at a time)", title_justify="left")
        for column in ("from", "to", "address", "GB/s", "Gbit/s", ""):
            table.add_column(column)
        for link in self.links:
            verdict = "ok" if link.ok else f"[red]below {self.min_gbps:g} Gbit/s[/]"
            table.add_row(link.from_, link.to, link.address, f"{link.gbs:.3f}",
                          f"{link.gbits:.2f}", verdict)
        return table


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
