"""`orchestrator up`: the long-running service, from config to a supervised, served gang.

    validate ─▶ connect every node ─▶ fingerprints ─▶ preflight ─▶ gateway ─▶ supervisor.run()
                                                       │ failures: report all, exit 2

Shutdown in stages, as uvicorn does it: the first Ctrl-C or SIGTERM stops accepting
requests and lets in-flight ones finish for up to stop_grace_s, then every rank is
stopped (SIGTERM, then SIGKILL) and the agents closed; a second Ctrl-C skips the wait.
Signal handlers only record the signal; the main coroutine acts on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import httpx
import uvicorn

from contract.http_limits import raise_file_limit, server_options
from contract.placement import Placement
from node_agent.host_ops import ports_in_use
from orchestrator.config import ClusterSpec
from orchestrator.gateway.app import create_app
from orchestrator.gateway.http_protocol import HttpProtocol
from orchestrator.launch import launch_secret, thinking_key
from orchestrator.launch.adoption import adopt_or_clear, launch_record
from orchestrator.launch.gang import Gang
from orchestrator.launch.plan import build_plan, new_launch_id
from orchestrator.launch.plan_command import describe
from orchestrator.launch.reachability import LinkChecks, link_table
from orchestrator.launch.stale_ranks import end_stale_ranks
from orchestrator.placement.decide import place
from orchestrator.preflight.checks import run_preflight
from orchestrator.provision.sync.command import UpSync, sync_before_up
from orchestrator.state_file import (
    ClusterState,
    RankRecord,
    orchestrator_alive,
    own_start_time,
    read_state,
    remove_state,
    state_path,
    write_state,
)
from orchestrator.status.report import build_status
from orchestrator.supervision.failures import RunResult
from orchestrator.supervision.metrics import OrchestratorMetrics
from orchestrator.supervision.monitor import GangMonitor
from orchestrator.supervision.progress import Rank0Probe
from orchestrator.supervision.state import GangState, StateMachine
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transports.pool import USAGE_INTERVAL_S, NodePool
from orchestrator.usage_metrics import NodeUsageCollector

log = logging.getLogger("orchestrator")

EXIT_OK = 0
EXIT_NOT_STARTED = 2


class Service:
    def __init__(self, spec: ClusterSpec, config_path: Path) -> None:
        self.spec, self.config_path = spec, config_path
        self.metrics = OrchestratorMetrics()
        self.machine = StateMachine()
        self.state_file = state_path(spec)
        self._signals = 0
        self._shutdown = asyncio.Event()
        self._force = asyncio.Event()
        self._keep_ranks = False  # `down --keep-ranks`: exit, the gang serves on to be adopted
        self.placement: Placement | None = None  # decided at preflight, kept for relaunches
        # Whether this `up` holds the cluster's state: it adopted the running gang or ended
        # any earlier one. Before that, the state file and launch secret are the previous
        # run's, which a later `up` needs to adopt its orphaned gang.
        self._owner = False

    async def run(self) -> int:
        raise_file_limit()  # room for the gateway's connections (contract/http_limits.py)
        previous = read_state(self.state_file)
        if previous is not None and orchestrator_alive(previous):
            log.error(
                "cluster %r is already run by orchestrator pid %d (%s); "
                "`orchestrator down %s` stops it",
                self.spec.cluster.name,
                previous.orchestrator_pid,
                previous.api_url,
                self.config_path,
            )
            return EXIT_NOT_STARTED
        if ports_in_use(self.spec.api.host, [self.spec.api.port]):
            log.error(
                "%s:%d (api.port) is already in use by another process: free it or set "
                "[api] port; nothing was started or changed",
                self.spec.api.host, self.spec.api.port,
            )
            return EXIT_NOT_STARTED
        self._install_signal_handlers()
        self._write_state()  # from now on `status` says starting and a second `up` is refused
        async with httpx.AsyncClient() as http:
            pool = NodePool(
                self.spec,
                on_event=lambda node, event: monitor.on_agent_event(node, event),
                on_lost=lambda node, info: monitor.on_agent_lost(node, info),
                usage_interval_s=USAGE_INTERVAL_S,
            )
            self.metrics.registry.register(NodeUsageCollector(pool.nodes))
            links = LinkChecks(self.spec, pool)
            monitor = GangMonitor(pool.nodes, self.metrics, time.monotonic, links.hops)
            self.supervisor = Supervisor(
                self.spec,
                pool,
                self.metrics,
                self.machine,
                monitor,
                Rank0Probe(http),
                lambda: self._new_gang(pool),
                links=links,
                on_launch=self._record_launch,
            )
            try:
                if not await self._prepare(pool, links, previous):
                    self.machine.to(GangState.STOPPED, "did not start")
                    return EXIT_NOT_STARTED
                await self._serve(pool)
            finally:
                await pool.close_all()
                self._release_state(previous)
        return EXIT_OK

    def _release_state(self, previous: ClusterState | None) -> None:
        """Only the `up` that owns the state removes it (and the launch secret); one that
        exits before it owns anything puts the previous run's record back as it was."""
        if self._keep_ranks:  # `status`, `down` and `up` find the gang by them
            return
        if not self._owner:
            if previous is not None:
                write_state(self.state_file, previous)
            else:
                remove_state(self.state_file)
            return
        remove_state(self.state_file)
        launch_secret.remove(self.spec.state_dir, self.spec.cluster.name)

    async def _prepare(
        self, pool: NodePool, links: LinkChecks, previous: ClusterState | None
    ) -> bool:
        """Connect, clean up after a crashed run, preflight. False: reported, do not start."""
        self.machine.to(GangState.CONNECTING)
        errors = await pool.connect_all()
        for error in errors:
            log.error("cannot reach node %s (%s): %s", error.node, error.kind, error.message)
        if errors:
            return False
        adopted = await adopt_or_clear(self.spec, pool)
        self._owner = True  # the running gang is ours now, or was ended
        if adopted is not None:
            self.machine.to(GangState.PREFLIGHT, f"adopting launch {adopted.launch_id}")
            self.placement = adopted.plan.placement
            self.supervisor.adopt(adopted)
            return True
        if previous is not None:  # a crashed run's ranks, recorded before we overwrote its file
            await end_stale_ranks(pool, previous.ranks)
        synced = UpSync(ok=True)
        if self.spec.model.sync:
            synced = await sync_before_up(self.spec, pool, self.config_path)
        if not synced.ok:
            return False
        self.machine.to(GangState.PREFLIGHT)
        fingerprints = await pool.fingerprint_all()
        placement = synced.placement or place(self.spec, fingerprints)  # the split sync sent
        failures = run_preflight(
            self.spec, fingerprints, await self._busy_ports(pool), placement
        )
        for failure in failures:
            self.metrics.preflight_failures.labels(check=failure.check).inc()
        if failures:
            report = "\n".join("  " + failure.render() for failure in failures)
            log.error("preflight failed, nothing was launched:\n%s", report)
            return False
        unreachable = await links.check()
        if unreachable:
            self.metrics.preflight_failures.labels(check="links").inc(len(unreachable))
            log.error(
                "preflight failed: links between ranks do not answer, nothing was launched:\n%s",
                link_table(unreachable),
            )
            return False
        log.info("preflight passed on %d nodes, %d links", len(fingerprints), len(links.hops))
        if isinstance(placement, Placement):
            self.placement = placement
            self.metrics.show_placement(placement)
            log.info("%s", describe(placement))
        return True

    async def _busy_ports(self, pool: NodePool) -> dict[str, list[str]]:
        busy: dict[str, list[str]] = {}
        if ports_in_use(self.spec.api.host, [self.spec.api.port]):
            busy["orchestrator"] = [f"{self.spec.api.host}:{self.spec.api.port} (api.port)"]
        listeners = [
            (node, node.rank_ip, self.spec.cluster.rank_port + rank)
            for rank, node in enumerate(self.spec.nodes)
        ]
        listeners.append(
            (self.spec.nodes[0], self.spec.rank0_api_host, self.spec.serving.rank_api_port)
        )
        for node, host, port in listeners:
            if await pool.agent(node.name).ports_in_use(host, [port]):
                busy.setdefault(node.name, []).append(f"{host}:{port}")
        return busy

    async def _serve(self, pool: NodePool) -> None:
        api_key = os.environ.get(self.spec.api.api_key_env) if self.spec.api.api_key_env else None
        supervisor, view = self.supervisor, self.supervisor.view
        app = create_app(
            view,
            lambda: build_status(self.spec, pool.nodes.values(), view.snapshot(), self.placement),
            self.metrics,
            api_key=api_key or None,
            request_timeout_s=self.spec.serving.request_timeout_s,
            serving=lambda: view.snapshot().serving,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=self.spec.api.host,
                port=self.spec.api.port,
                log_level="warning",
                timeout_graceful_shutdown=int(self.spec.supervisor.stop_grace_s) or None,
                http=HttpProtocol,
                **server_options(),
            )
        )
        # uvicorn inside our loop: the service owns the signals, not uvicorn.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        gateway = asyncio.create_task(server.serve())
        supervision = asyncio.create_task(supervisor.run())
        log.info(
            "gateway at http://%s:%d (health, status, metrics, /v1)",
            self.spec.api.host,
            self.spec.api.port,
        )
        await asyncio.wait(
            [gateway, supervision, asyncio.create_task(self._shutdown.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        await self._stop(server, gateway, supervision)

    async def _stop(
        self,
        server: uvicorn.Server,
        gateway: asyncio.Task[None],
        supervision: asyncio.Task[RunResult],
    ) -> None:
        grace = self.spec.supervisor.stop_grace_s
        log.info("stopping: no new requests; in-flight ones get up to %g s", grace)
        server.should_exit = True
        self.supervisor.view.begin_drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained(gateway)), grace + 1)
        server.force_exit = True
        if self._keep_ranks:
            log.info("exiting; the ranks keep serving for up to %g s: `orchestrator up` adopts "
                     "them, `orchestrator down` ends them", self.spec.supervisor.orphan_grace_s)
        else:
            log.info("stopping every rank")
        self.supervisor.request_stop(force=self._force.is_set(), keep_ranks=self._keep_ranks)
        result = await supervision
        with contextlib.suppress(BaseException):
            await gateway
        last = f"; last failure {result.last.root.summary()}" if result.last else ""
        log.info("stopped after %d restart(s)%s", result.restarts, last)

    async def _drained(self, gateway: asyncio.Task[None]) -> None:
        await asyncio.wait(
            [gateway, asyncio.create_task(self._force.wait())], return_when=asyncio.FIRST_COMPLETED
        )

    def _new_gang(self, pool: NodePool) -> Gang:
        fingerprints = pool.fingerprints()
        plan = build_plan(self.spec, new_launch_id(), fingerprints, self.placement)
        thinking_key.give_to_rank0(
            plan, thinking_key.ensure(self.spec.state_dir, self.spec.cluster.name))
        return Gang(plan, pool, launch_record(self.spec, plan, fingerprints))

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
        self._write_state(gang.launch_id, ranks)

    def _write_state(self, launch_id: str = "", ranks: list[RankRecord] | None = None) -> None:
        write_state(
            self.state_file,
            ClusterState(
                cluster=self.spec.cluster.name,
                config=str(self.config_path.resolve()),
                orchestrator_pid=os.getpid(),
                orchestrator_started=own_start_time(),
                api_url=f"http://{self.spec.api.host}:{self.spec.api.port}",
                api_key_env=self.spec.api.api_key_env or "",
                launch_id=launch_id,
                ranks=ranks or [],
            ),
        )

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, lambda: self.supervisor.request_restart())
        loop.add_signal_handler(signal.SIGUSR1, self._on_keep_ranks_signal)

    def _on_keep_ranks_signal(self) -> None:
        """`down --keep-ranks`: stop like `down` but leave the ranks serving for adoption."""
        if self.spec.supervisor.orphan_grace_s > 0:
            self._keep_ranks = True
        self._shutdown.set()

    def _on_stop_signal(self) -> None:
        self._signals += 1
        self._shutdown.set()
        if self._signals > 1:
            self._force.set()
