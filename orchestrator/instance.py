"""One model instance of `orchestrator up`: its nodes' agents, its preflight, its gang and
its supervisor, its state file and launch secret.

`orchestrator up` (up.py) runs one per `[[instances]]` table (one for a file without),
each on the single-model spec orchestrator/config/instances.py derives: its own pool of
agents (their sockets are named after the instance's cluster name, so a node shared by
two instances runs one agent for each), its own state machine, restarts and adoption. A
failing instance never touches another.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import httpx

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from node_agent.host_ops import ports_in_use
from orchestrator.config import ClusterSpec
from orchestrator.launch import launch_secret, thinking_key
from orchestrator.launch.adoption import adopt_or_clear, launch_record, left_out
from orchestrator.launch.gang import Gang
from orchestrator.launch.plan import build_plan, new_launch_id
from orchestrator.launch.plan_command import describe
from orchestrator.launch.reachability import LinkChecks, link_table
from orchestrator.launch.stale_ranks import end_stale_ranks
from orchestrator.placement.decide import place
from orchestrator.preflight.checks import run_preflight
from orchestrator.provision.sync.up_sync import UpSync
from orchestrator.state_file import (
    ClusterState,
    RankRecord,
    own_start_time,
    read_state,
    remove_state,
    state_path,
    write_state,
)
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.progress import Rank0Probe
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import USAGE_INTERVAL_S, NodePool
from orchestrator.usage_metrics import NodeUsageCollector

log = logging.getLogger("orchestrator")


class Instance:
    """`name` is "" for a file without `[[instances]]`."""

    def __init__(self, name: str, spec: ClusterSpec, config_path: Path, api: ClusterSpec) -> None:
        self.name, self.spec, self.config_path, self.api = name, spec, config_path, api
        self.metrics = OrchestratorMetrics()
        self.machine = StateMachine()
        self.state_file = state_path(spec)
        self.previous = read_state(self.state_file)
        self.placement: Placement | None = None  # decided at preflight, kept for relaunches
        self.fingerprints: dict[str, NodeFingerprint] = {}
        self.adopted = False
        # Ranks per node's machine over every instance of the `up` (set once all are
        # prepared): replicas on one machine split its cores (serving/blas.py).
        self.machine_ranks: dict[str, int] | None = None
        # Whether this `up` holds the instance's state: it adopted the running gang or
        # ended any earlier one. Before that, the state file and launch secret are the
        # previous run's, which a later `up` needs to adopt its orphaned gang.
        self.owner = False

    def open(self, http: httpx.AsyncClient) -> None:
        """Its pool of agents, monitor and supervisor (nothing connects yet)."""
        self.pool = pool = NodePool(
            self.spec,
            on_event=lambda node, event: monitor.on_agent_event(node, event),
            on_lost=lambda node, info: monitor.on_agent_lost(node, info),
            usage_interval_s=USAGE_INTERVAL_S,
        )
        self.metrics.registry.register(NodeUsageCollector(pool.nodes))
        self.links = LinkChecks(self.spec, pool)
        monitor = GangMonitor(pool.nodes, self.metrics, time.monotonic, self.links.hops)
        self.supervisor = Supervisor(
            self.spec, pool, self.metrics, self.machine, monitor, Rank0Probe(http),
            self._new_gang, links=self.links, on_launch=self._record_launch,
            fewer_gang=lambda fewer: self._new_gang(fewer.spec, fewer.placement),
            before_every_node=self._place_every_node,
        )

    def release_state(self, keep_ranks: bool) -> None:
        """Only the `up` that owns the state removes it (and the launch secret); one that
        exits before it owns anything puts the previous run's record back as it was."""
        if keep_ranks:  # `status`, `down` and `up` find the gang by them
            return
        if not self.owner:
            if self.previous is not None:
                write_state(self.state_file, self.previous)
            else:
                remove_state(self.state_file)
            return
        remove_state(self.state_file)
        launch_secret.remove(self.spec.state_dir, self.spec.cluster.name)

    async def connect(self) -> bool:
        """Connect, then adopt the running gang or clean up after a crashed run. False:
        reported, do not start. Then (unless adopted) `up` syncs (up_sync.py) and calls
        preflight()."""
        self.machine.to(GangState.CONNECTING)
        errors = await self.pool.connect_all()
        for error in errors:
            log.error("%scannot reach node %s (%s): %s", self._tag, error.node, error.kind,
                      error.message)
        # A node unreachable: only a gang re-planned without it can be adopted (else
        # nothing starts, and the gang is left to the orphan grace).
        adopted = await adopt_or_clear(self.spec, self.pool, clear=not errors)
        if adopted is None and errors:
            return False
        self.owner = True  # the running gang is ours now, or was ended
        if adopted is not None:
            self.machine.to(GangState.PREFLIGHT, f"adopting launch {adopted.launch_id}")
            self.adopted = True
            if adopted.record is None or not left_out(self.spec, adopted.record):
                self.placement = adopted.plan.placement
            else:  # on fewer nodes: every node's placement is decided once they answer
                await self._place_every_node()
            self.supervisor.adopt(adopted)
            return True
        if self.previous is not None:  # a crashed run's ranks, recorded before we overwrote
            await end_stale_ranks(self.pool, self.previous.ranks)
        return True

    async def preflight(self, synced: UpSync) -> bool:
        """Preflight on the synced nodes (`synced`: the outcome of the model's sync, or
        ok without one). False: reported, do not start."""
        if not synced.ok:
            return False
        self.machine.to(GangState.PREFLIGHT)
        self.fingerprints = fingerprints = await self.pool.fingerprint_all()
        placement = synced.placement or place(self.spec, fingerprints)  # the split sync sent
        failures = run_preflight(self.spec, fingerprints, await self._busy_ports(), placement)
        for failure in failures:
            self.metrics.preflight_failures.labels(check=failure.check).inc()
        if failures:
            report = "\n".join("  " + failure.render() for failure in failures)
            log.error("%spreflight failed, nothing was launched:\n%s", self._tag, report)
            return False
        return await self._links_answer(placement)

    async def _place_every_node(self) -> None:
        """The placement on every node (for a gang adopted on fewer nodes: the one the
        switch back launches), once every node answers; until then none."""
        if self.placement is not None or not all(n.connected for n in self.pool.nodes.values()):
            return
        try:
            placed = place(self.spec, await self.pool.fingerprint_all())
        except (TransportError, AgentRequestError) as exc:
            log.warning("%sno placement on every node yet: %s", self._tag, exc)
            return
        self.placement = placed if isinstance(placed, Placement) else None

    async def _links_answer(self, placement: Placement | object) -> bool:
        unreachable = await self.links.check()
        if unreachable:
            self.metrics.preflight_failures.labels(check="links").inc(len(unreachable))
            log.error(
                "%spreflight failed: links between ranks do not answer, nothing was "
                "launched:\n%s", self._tag, link_table(unreachable),
            )
            return False
        log.info("%spreflight passed on %d nodes, %d links", self._tag,
                 len(self.fingerprints), len(self.links.hops))
        if isinstance(placement, Placement):
            self.placement = placement
            self.metrics.show_placement(placement)
            log.info("%s%s", self._tag, describe(placement, self.spec.serving.max_batch_size))
        return True

    @property
    def _tag(self) -> str:
        return f"[{self.name}] " if self.name else ""

    async def _busy_ports(self) -> dict[str, list[str]]:
        busy: dict[str, list[str]] = {}
        api = self.api.api
        if ports_in_use(api.host, [api.port]):
            busy["orchestrator"] = [f"{api.host}:{api.port} (api.port)"]
        listeners = [
            (node, node.rank_ip, self.spec.cluster.rank_port + rank)
            for rank, node in enumerate(self.spec.nodes)
        ]
        listeners.append(
            (self.spec.nodes[0], self.spec.rank0_api_host, self.spec.serving.rank_api_port)
        )
        for node, host, port in listeners:
            if await self.pool.agent(node.name).ports_in_use(host, [port]):
                busy.setdefault(node.name, []).append(f"{host}:{port}")
        return busy

    def _new_gang(self, spec: ClusterSpec | None = None,
                  placement: Placement | None = None) -> Gang:
        """A gang on every node; or, given `spec` and `placement`, on fewer (a re-plan)."""
        spec, placement = (spec, placement) if spec else (self.spec, self.placement)
        fingerprints = self.pool.fingerprints()
        plan = build_plan(spec, new_launch_id(), fingerprints, placement, self.machine_ranks)
        thinking_key.give_to_rank0(
            plan, thinking_key.ensure(self.spec.state_dir, self.spec.cluster.name))
        return Gang(plan, self.pool, launch_record(self.spec, plan, fingerprints, spec))

    def _record_launch(self, gang: Gang) -> None:
        # Kept for whoever must reach this launch's rank 0 later (an adopting orchestrator).
        launch_secret.save(self.spec.state_dir, self.spec.cluster.name,
                           launch_secret.LaunchSecret(launch_id=gang.launch_id,
                                                      secret=gang.plan.secret,
                                                      tls_cert=gang.plan.tls_cert))
        ranks = [
            RankRecord(rank=p.rank, node=p.node, pid=p.pid, launch_id=gang.launch_id)
            for p in gang.ranks.values()
            if p.pid is not None
        ]
        self.write_state(gang.launch_id, ranks)

    def write_state(self, launch_id: str = "", ranks: list[RankRecord] | None = None) -> None:
        write_state(
            self.state_file,
            ClusterState(
                cluster=self.spec.cluster.name,
                config=str(self.config_path.resolve()),
                orchestrator_pid=os.getpid(),
                orchestrator_started=own_start_time(),
                api_url=f"http://{self.api.api.host}:{self.api.api.port}",
                api_key_env=self.api.api.api_key_env or "",
                launch_id=launch_id,
                ranks=ranks or [],
            ),
        )
