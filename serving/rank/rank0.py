"""Rank 0: the OpenAI API in the main thread's event loop, the engine in its own thread.

The API binds before the model loads so that /health answers 503 while loading.
Shutdown stages (SIGTERM/SIGINT): stop accepting (health 503), let in-flight requests
finish up to shutdown_grace_s, send the workers a shutdown plan, stop the HTTP server.
A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

import mlx.core as mx
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contract.exit_codes import RankExit
from contract.http_limits import HeadDeadline, raise_file_limit, server_options
from contract.launch_secret import LaunchSecretError, read_secret_file
from contract.openai_errors import ENGINE_ERROR
from contract.rank_env import FORCED_OUTPUT
from contract.settings import RankSettings
from serving.api.app import create_app
from serving.api.state import ServedModel, ServingState
from serving.api.thinking_signature import load_key
from serving.distributed import DistributedEnv
from serving.engine.engine import Engine
from serving.engine.prefill_pacing import PrefillPacer
from serving.engine.speculative import Speculator
from serving.engine.step_plan import PlanChannel
from serving.faults import FaultPlan
from serving.metrics import ServingMetrics
from serving.rank.peer_watch import PeerWatch
from serving.rank.startup import exit_for, join_group, load_and_sync, make_batch

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and an accepted socket inherits the listener's. With proto 0, Nagle held each
    # response's body until the client's delayed ACK: 40 ms on every plain response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class HttpProtocol(HeadDeadline, HttpToolsProtocol):
    """uvicorn's C-parser protocol with a deadline and a cap on each request head."""


class Rank0:
    def __init__(
        self,
        settings: RankSettings,
        group: mx.distributed.Group,
        faults: FaultPlan,
        peer_watch: PeerWatch,
        launch_secret: str | None = None,
    ) -> None:
        self.settings = settings
        self.peer_watch = peer_watch
        self.group = group
        self.faults = faults
        self.state = ServingState(
            settings, settings.model.served_id, group.size(), ServingMetrics(),
            created=int(time.time()), launch_secret=launch_secret,
            thinking_key=load_key(Path.cwd()),
        )
        self.exit_code: int = RankExit.OK
        self.stop_requested = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: uvicorn.Server | None = None

    # -- engine thread ----------------------------------------------------------------
    def engine_main(self) -> None:
        try:
            self.exit_code = self._load_and_run()
        except Exception as exc:
            self.exit_code = exit_for(exc)
            if self.state.engine is not None:  # tell in-flight clients instead of cutting them
                self.state.engine.fail_all(
                    f"engine failed: {RankExit(self.exit_code).meaning}", ENGINE_ERROR)
        finally:
            self.state.status = "stopping"
            if self.loop is not None and self.server is not None:
                server = self.server
                self.loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    def _load_and_run(self) -> int:
        group = self.group
        loaded = load_and_sync(self.settings, group, self.faults)
        batch = make_batch(self.settings, loaded, group)
        channel = PlanChannel(group, batch.stream) if group.size() > 1 else None
        engine = Engine(
            batch, channel, loaded.tokenizer,
            max_batch_size=self.settings.serving.max_batch_size,
            queue_limit=self.settings.serving.queue_limit,
            keepalive_s=self.settings.serving.keepalive_s,
            faults=self.faults,
            metrics=self.state.metrics,
            pacer=PrefillPacer(batch.max_prefill_chunk, self.settings.serving.prefill_max_slowdown),
            comm_profile=self.settings.serving.comm_profile,
            speculator=Speculator(self.settings.serving.num_draft_tokens, self.state.metrics,
                                  loaded.draft)
            if self.settings.serving.speculative != "off" else None,
        )
        self.peer_watch.before_exit = lambda: engine.fail_all(
            f"engine failed: {RankExit.PEER_LOST.meaning}", ENGINE_ERROR)
        forced = os.environ.get(FORCED_OUTPUT)
        info = ServedModel(
            loaded.tokenizer, loaded.context_length, loaded.vocab_size,
            forced_output=loaded.tokenizer.encode(forced, add_special_tokens=False)
            if forced else [],
        )
        self.state.set_ready(engine, info)
        if self.stop_requested.is_set():
            engine.begin_stop(0)
        else:
            log.info("ready: serving %s on %s:%d", self.state.model_id,
                     self.settings.api_host, self.settings.serving.rank_api_port)
        return engine.run()

    # -- main thread ------------------------------------------------------------------
    def on_signal(self, signum: int) -> None:
        """Record the stop; the engine and uvicorn act on it. A second signal forces exit."""
        if self.stop_requested.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(RankExit.OK)
        log.info("%s: stopping (grace %.0f s)", signal.Signals(signum).name,
                 self.settings.shutdown_grace_s)
        self.stop_requested.set()
        with self.state.lock:
            self.state.status = "stopping"
            engine = self.state.engine
        if engine is not None:
            engine.begin_stop(self.settings.shutdown_grace_s)
        elif self.server is not None:
            self.server.should_exit = True  # still joining or loading: nothing to drain

    async def serve(self, sock: socket.socket) -> None:
        self.loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, self.on_signal, signum)
        config = uvicorn.Config(
            create_app(self.state), log_level="warning", lifespan="on",
            timeout_graceful_shutdown=5, http=HttpProtocol, **server_options(),
            # Beyond loopback, TLS with the launch's own certificate (the gateway pins it).
            ssl_keyfile=self.settings.api_tls_key_file,
            ssl_certfile=self.settings.api_tls_cert_file,
        )
        self.server = uvicorn.Server(config)
        # Our handlers (above) decide how to stop, not uvicorn's.
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        thread = threading.Thread(target=self.engine_main, name="engine", daemon=True)
        thread.start()
        await self.server.serve(sockets=[sock])


def run_rank0(
    settings: RankSettings, env: DistributedEnv, faults: FaultPlan, peer_watch: PeerWatch
) -> int:
    """Bind the API address, join the group, then serve while the engine thread loads.

    mx.distributed.init holds the GIL while it waits for peers, so the group is joined
    here, before the event loop starts; /health answers (503) from then on, through
    model loading, until the engine is ready.
    """
    try:  # the secret's value is never logged, only where it failed to come from
        secret = None if settings.api_secret_file is None else read_secret_file(
            Path(settings.api_secret_file))
    except LaunchSecretError as exc:
        log.error("%s", exc)
        return RankExit.CONFIG_ERROR
    raise_file_limit()
    try:
        sock = bind(settings.api_host, settings.serving.rank_api_port)
    except OSError as exc:
        log.error("cannot bind %s:%d: %s", settings.api_host, settings.serving.rank_api_port, exc)
        return RankExit.API_BIND_FAILED
    try:
        group = join_group(env)
    except Exception as exc:
        return exit_for(exc)
    rank0 = Rank0(settings, group, faults, peer_watch, secret)
    asyncio.run(rank0.serve(sock))
    return rank0.exit_code
