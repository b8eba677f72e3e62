"""`orchestrator up`: the long-running service, from config to a supervised, served gang.

    validate ─▶ connect every node ─▶ fingerprints ─▶ preflight ─▶ gateway ─▶ supervisor.run()
                                                       │ failures: report all, exit 2

Shutdown in stages, as uvicorn does it: the first Ctrl-C or SIGTERM stops accepting
requests and lets in-flight ones finish for up to stop_grace_s, then every rank is
stopped (SIGTERM, then SIGKILL) and the agents closed; a second Ctrl-C skips the wait.
Signal handlers only record the signal; the main coroutine acts on it.

With `[[instances]]` it runs one Instance (orchestrator/instance.py: pool, preflight,
supervisor, state file) per table, side by side, behind one gateway that routes by model
(orchestrator/gateway/routing.py); a file without is one instance, as it always was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from contract.fingerprint import ranks_per_machine
from contract.http_limits import raise_file_limit, server_options
from node_agent.host_ops import ports_in_use
from orchestrator.config import ClusterSpec
from orchestrator.config.instances import instance_specs
from orchestrator.gateway.app import create_app
from orchestrator.gateway.http_protocol import HttpProtocol
from orchestrator.gateway.routing import ModelRoute, ModelRouter, Replica
from orchestrator.gateway.view import ClusterView
from orchestrator.instance import Instance
from orchestrator.instance_metrics import merge_registries
from orchestrator.preflight.shared_nodes import shared_memory_failures
from orchestrator.provision.sync.up_sync import UpSync, sync_for_up
from orchestrator.state_file import (
    ClusterState,
    orchestrator_alive,
    own_start_time,
    remove_state,
    state_path,
    write_state,
)
from orchestrator.status.instances import build_instances_status
from orchestrator.status.model import ClusterStatus
from orchestrator.status.report import build_status
from orchestrator.supervision.failures import RunResult
from orchestrator.supervision.metrics import GatewayCounters
from orchestrator.supervision.progress import ServingSample
from orchestrator.supervision.state import GangState
from orchestrator.supervision.supervisor import Supervisor

log = logging.getLogger("orchestrator")

EXIT_OK = 0
EXIT_NOT_STARTED = 2


class Service:
    def __init__(self, spec: ClusterSpec, config_path: Path) -> None:
        self.spec, self.config_path = spec, config_path
        self.instances = [Instance(name, derived, config_path, spec)
                          for name, derived in instance_specs(spec).items()]
        first = self.instances[0]
        self.metrics, self.machine = first.metrics, first.machine
        self.several = bool(spec.instances)
        # With [[instances]], the file's own state file names the orchestrator (`status`,
        # `down`, `restart` read it); each instance keeps its own for adoption.
        self.state_file = state_path(spec)
        self._signals = 0
        self._shutdown = asyncio.Event()
        self._force = asyncio.Event()
        self._keep_ranks = False  # `down --keep-ranks`: exit, the gang serves on to be adopted

    @property
    def supervisor(self) -> Supervisor:  # the first (the only one without [[instances]])
        return self.instances[0].supervisor

    async def run(self) -> int:
        raise_file_limit()  # room for the gateway's connections (contract/http_limits.py)
        for instance in self.instances:
            previous = instance.previous
            if previous is not None and orchestrator_alive(previous):
                log.error(
                    "cluster %r is already run by orchestrator pid %d (%s); "
                    "`orchestrator down %s` stops it",
                    previous.cluster, previous.orchestrator_pid, previous.api_url,
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
            for instance in self.instances:
                instance.open(http)
            try:
                if not await self._prepare():
                    for instance in self.instances:
                        instance.machine.to(GangState.STOPPED, "did not start")
                    return EXIT_NOT_STARTED
                await self._serve()
            finally:
                await asyncio.gather(*(i.pool.close_all() for i in self.instances))
                self._release_state()
        return EXIT_OK

    def _write_state(self) -> None:
        for instance in self.instances:
            instance.write_state()
        if self.several:
            write_state(self.state_file, ClusterState(
                cluster=self.spec.cluster.name,
                config=str(self.config_path.resolve()),
                orchestrator_pid=os.getpid(),
                orchestrator_started=own_start_time(),
                api_url=f"http://{self.spec.api.host}:{self.spec.api.port}",
                api_key_env=self.spec.api.api_key_env or "",
            ))

    def _release_state(self) -> None:
        for instance in self.instances:
            instance.release_state(self._keep_ranks)
        if self.several and not self._keep_ranks:
            remove_state(self.state_file)

    async def _prepare(self) -> bool:
        """Every instance connected and adopted, or synced (each model once) and
        preflighted; then the memory of nodes shared by several instances, summed. False:
        reported, do not start."""
        connected = await asyncio.gather(*(i.connect() for i in self.instances))
        if not all(connected):
            return False
        launching = [i for i in self.instances if not i.adopted]
        synced: dict[str, UpSync] = {}
        if self.spec.model.sync and launching:  # each (model, node) once, however many share it
            synced = await sync_for_up(self.spec, {i.name: (i.spec, i.pool) for i in launching},
                                       [i.pool for i in self.instances], self.config_path)
        ready = await asyncio.gather(
            *(i.preflight(synced.get(i.name, UpSync(ok=True))) for i in launching))
        if not all(ready):
            return False
        fresh = {i.name: (i.spec, i.placement) for i in self.instances if not i.adopted}
        prints = {k: v for i in self.instances for k, v in i.fingerprints.items()}
        failures = shared_memory_failures(self.spec, fresh, prints)
        if failures:
            report = "\n".join("  " + failure.render() for failure in failures)
            log.error("preflight failed: instances sharing a node do not fit together, "
                      "nothing was launched:\n%s", report)
            return False
        if self.several:  # replicas on one machine split its cores, as one gang's ranks do
            known = {k: v for i in self.instances for k, v in i.pool.fingerprints().items()}
            sharing = ranks_per_machine(
                [n.name for i in self.instances for n in i.spec.nodes], known)
            for instance in self.instances:
                instance.machine_ranks = sharing
        return True

    def _gateway_parts(self) -> tuple[ClusterView, ModelRouter | None]:
        """What the gateway reads: the one supervisor's view, or every instance's together
        (/health) and a router by model id and alias."""
        if not self.several:
            return self.instances[0].supervisor.view, None
        by_id: dict[str, list[Replica]] = {}
        aliases: dict[str, str] = {}
        for instance in self.instances:
            model = instance.spec.model
            by_id.setdefault(model.served_id, []).append(
                Replica(instance.name, instance.supervisor.view, instance.metrics))
            aliases.update({alias: model.served_id for alias in model.aliases})
        routes = [ModelRoute(model_id, replicas) for model_id, replicas in by_id.items()]
        everything = ModelRoute("", [Replica(i.name, i.supervisor.view) for i in self.instances])
        return everything, ModelRouter(routes, aliases)

    async def _serve(self) -> None:
        api_key = os.environ.get(self.spec.api.api_key_env) if self.spec.api.api_key_env else None
        view, router = self._gateway_parts()
        first = self.instances[0]
        # With several instances, the gateway's counters of requests no instance saw
        # (orchestrator/gateway/booking.py), served without the model_instance label.
        counters = GatewayCounters(CollectorRegistry()) if self.several else None
        if counters is not None:
            self.metrics.expose(merge_registries(
                {"": counters.registry, **{i.name: i.metrics.registry for i in self.instances}}))
        app = create_app(
            view,
            self._status,
            self.metrics,
            api_key=api_key or None,
            request_timeout_s=self.spec.serving.request_timeout_s,
            serving=lambda: first.supervisor.view.snapshot().serving,
            router=router,
            counters=counters,
            instances_serving=self._instances_serving if self.several else None,
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
        supervisions = [asyncio.create_task(i.supervisor.run()) for i in self.instances]
        log.info(
            "gateway at http://%s:%d (health, status, metrics, /v1)",
            self.spec.api.host,
            self.spec.api.port,
        )
        # One instance failing for good leaves the others serving: the service ends when
        # every supervisor has, the gateway stops, or a signal asks.
        every = asyncio.create_task(self._all_ended(supervisions))
        await asyncio.wait(
            [gateway, every, asyncio.create_task(self._shutdown.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        await self._stop(server, gateway, supervisions)

    @staticmethod
    async def _all_ended(supervisions: list[asyncio.Task[RunResult]]) -> None:
        await asyncio.wait(supervisions)

    def _instances_serving(self) -> dict[str, ServingSample | None]:
        """Each instance's rank 0 counters, as its supervisor scraped them (the charts)."""
        return {i.name: i.supervisor.view.snapshot().serving for i in self.instances}

    def _status(self) -> ClusterStatus:
        if not self.several:
            instance = self.instances[0]
            return build_status(self.spec, instance.pool.nodes.values(),
                                instance.supervisor.view.snapshot(), instance.placement)
        return build_instances_status(self.spec, self.instances)

    async def _stop(
        self,
        server: uvicorn.Server,
        gateway: asyncio.Task[None],
        supervisions: list[asyncio.Task[RunResult]],
    ) -> None:
        grace = self.spec.supervisor.stop_grace_s
        log.info("stopping: no new requests; in-flight ones get up to %g s", grace)
        server.should_exit = True
        for instance in self.instances:
            instance.supervisor.view.begin_drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained(gateway)), grace + 1)
        server.force_exit = True
        if self._keep_ranks:
            log.info("exiting; the ranks keep serving for up to %g s: `orchestrator up` adopts "
                     "them, `orchestrator down` ends them", self.spec.supervisor.orphan_grace_s)
        else:
            log.info("stopping every rank")
        for instance in self.instances:
            instance.supervisor.request_stop(force=self._force.is_set(),
                                             keep_ranks=self._keep_ranks)
        for instance, supervision in zip(self.instances, supervisions, strict=True):
            result = await supervision
            last = f"; last failure {result.last.root.summary()}" if result.last else ""
            tag = f"[{instance.name}] " if instance.name else ""
            log.info("%sstopped after %d restart(s)%s", tag, result.restarts, last)
        with contextlib.suppress(BaseException):
            await gateway

    async def _drained(self, gateway: asyncio.Task[None]) -> None:
        await asyncio.wait(
            [gateway, asyncio.create_task(self._force.wait())], return_when=asyncio.FIRST_COMPLETED
        )

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_restart_signal)
        loop.add_signal_handler(signal.SIGUSR1, self._on_keep_ranks_signal)

    def _on_restart_signal(self) -> None:
        for instance in self.instances:
            instance.supervisor.request_restart()

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
