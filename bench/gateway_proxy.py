"""Benchmark: the gateway's own cost per request, without an engine's noise.

    .venv/bin/python bench/gateway_proxy.py [--pairs 300] [--delays 0 0.03] [--keep-awake]
                                            [--loops asyncio uvloop]

A stand-in rank 0 (uvicorn serving a bare ASGI app: a fixed model list, a fixed completion,
and a three-event SSE stream, each after `delay` seconds of "engine" time) and the real
gateway app (`create_app`, its cluster view always pointing at the stand-in) run as
separate processes, as in production. Per delay and kind (`GET /v1/models`, a plain
`POST /v1/completions`, a streamed one timed to its first content event) the same request
goes direct and through the gateway, the order alternating per pair, each path over its
own keep-alive connection; per pair: gateway - direct, the first 20 pairs are warm-up.

A bare relay (`relay_app`: the same pooled aiohttp hop with nothing else) runs beside
them and is measured the same way: the floor of any Python process in the path, so
gateway - relay is what the gateway's own code costs.

bench/gateway.py measures the same through a real `orchestrator up`, where the engine's
timing noise is larger than the proxy's cost. With `--keep-awake`, one SCHED_IDLE spinner per
CPU keeps the (virtual) CPUs out of idle, so the part of the cost that is waking an idle
CPU for one more process hop shows as the difference to a run without. `--loops` runs the
gateway on each event loop given (uvloop only if installed; the product runs asyncio's).
Figures go to bench/results/gateway-proxy-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from results_file import results_path  # noqa: E402

from bench.gateway import percentile  # noqa: E402
from testkit.ports import free_ports  # noqa: E402

KINDS = ("models", "plain", "stream")
WARMUP_PAIRS = 20
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
COMPLETION = json.dumps({"id": "cmpl-1", "object": "text_completion",
                         "choices": [{"index": 0, "text": "hello"}]},
                        separators=(",", ":")).encode()
PLAIN_BODY = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 4}).encode()
STREAM_BODY = json.dumps({"model": "m", "prompt": "Hi", "max_tokens": 4, "stream": True}).encode()

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


async def request_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def standin_app(delay_s: float) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    """Rank 0's API reduced to fixed answers after `delay_s`: what is left is HTTP."""

    async def respond(status: int, body: bytes, send: Send) -> None:
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await request_body(receive)
        await asyncio.sleep(delay_s)
        if scope["method"] == "GET":
            await respond(200, MODELS, send)
        elif not json.loads(body).get("stream"):
            await respond(200, COMPLETION, send)
        else:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for event in (b'{"choices":[{"index":0,"text":""}]}', COMPLETION):
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n",
                            "more_body": True})
            await asyncio.sleep(delay_s)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


def relay_app(upstream_url: str) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    """The floor of any Python hop: read the request, send it to the stand-in over the
    gateway's pooled aiohttp session, pass the answer back as it comes; nothing else (no
    routing, no checks, no resend, no disconnect watch)."""
    import aiohttp

    from orchestrator.gateway.app import rank0_session

    session: list[aiohttp.ClientSession] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                session.append(rank0_session())
                await send({"type": "lifespan.startup.complete"})
            await session[0].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await request_body(receive)
        headers = {"content-type": "application/json"}
        async with session[0].request(scope["method"], upstream_url + scope["path"], data=body,
                                      headers=headers) as response:
            kind = response.headers.get("content-type", "").encode()
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(b"content-type", kind)]})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


class FixedView:
    """A cluster that is always ready, rank 0 at the stand-in."""

    def __init__(self, upstream_url: str) -> None:
        from orchestrator.supervision.state import GangState

        self.state, self.reason, self.draining = GangState.READY, "", False
        self._upstream_url = upstream_url

    def wake_workers(self) -> None:
        pass

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Any:
        from orchestrator.supervision.snapshot import Upstream

        return Upstream(self._upstream_url, "standin")


def serve(role: str, port: int, arg: str, loop: str) -> None:
    import uvicorn

    if role == "standin":
        app: Any = standin_app(float(arg))
    elif role == "relay":
        app = relay_app(arg)
    else:
        from orchestrator.gateway.app import create_app
        from orchestrator.status.model import ClusterStatus
        from orchestrator.supervision.metrics import OrchestratorMetrics

        def no_status() -> ClusterStatus:
            raise NotImplementedError("the benchmark asks no status")

        app = create_app(FixedView(arg), no_status, OrchestratorMetrics(), api_key=None,
                         request_timeout_s=30)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop=loop)


@contextlib.contextmanager
def processes(commands: list[list[str]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start each command in its own process group; end them all by group."""
    started = [subprocess.Popen(command, start_new_session=True) for command in commands]
    try:
        yield started
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:  # e.g. a stand-in still inside a long delay
                os.killpg(process.pid, 9)
                process.wait()


def wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/v1/models")
            if connection.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing answered on port {port} within 60 s")


def timed(connection: http.client.HTTPConnection, kind: str) -> float:
    """Seconds to the whole answer (models, plain) or to the first content event."""
    start = time.perf_counter()
    if kind == "models":
        connection.request("GET", "/v1/models")
    else:
        body = STREAM_BODY if kind == "stream" else PLAIN_BODY
        connection.request("POST", "/v1/completions", body=body,
                           headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    if kind != "stream":
        response.read()
        return time.perf_counter() - start
    while b'"text":"hello"' not in (line := response.readline()):
        if not line:
            raise SystemExit("the stream ended without its content event")
    elapsed = time.perf_counter() - start
    response.read()
    return elapsed


def differences_ms(direct: int, gateway: int, kind: str, pairs: int) -> list[float]:
    connections = {port: http.client.HTTPConnection("127.0.0.1", port)
                   for port in (direct, gateway)}
    differences = []
    for pair in range(pairs):
        order = (direct, gateway) if pair % 2 == 0 else (gateway, direct)
        seconds = {port: timed(connections[port], kind) for port in order}
        differences.append((seconds[gateway] - seconds[direct]) * 1000)
        time.sleep(0.005)
    return differences[WARMUP_PAIRS:]


def measure(
    delay_s: float, pairs: int, keep_awake: bool, loop: str
) -> dict[str, dict[str, dict[str, float]]]:
    """Per hop (the gateway, the bare relay) and kind: percentiles of hop - direct."""
    direct, gateway, relay = free_ports(3)
    me = [sys.executable, __file__, "--serve"]
    upstream = f"http://127.0.0.1:{direct}"
    commands = [[*me, "standin", str(direct), str(delay_s), "asyncio"],
                [*me, "gateway", str(gateway), upstream, loop],
                [*me, "relay", str(relay), upstream, loop]]
    if keep_awake:
        # SCHED_IDLE: runs only when nothing else wants the CPU (nice 19 still takes slices).
        spin = [sys.executable, "-c",
                "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
                "while True: pass"]
        commands += [spin] * (os.cpu_count() or 1)
    figures: dict[str, dict[str, dict[str, float]]] = {"gateway": {}, "relay": {}}
    with processes(commands) as started:
        for port in (direct, gateway, relay):
            wait_ready(port)
        hops = {"gateway": (gateway, psutil.Process(started[1].pid)),
                "relay": (relay, psutil.Process(started[2].pid))}
        for kind in KINDS:
            for hop, (port, process) in hops.items():
                cpu_before = sum(process.cpu_times()[:2])
                values = differences_ms(direct, port, kind, pairs)
                # The hop's process serves only its own requests: its CPU time per request
                # is far steadier than latency on a shared machine.
                cpu_ms = (sum(process.cpu_times()[:2]) - cpu_before) * 1000 / pairs
                got = {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9),
                       "p99": percentile(values, 0.99), "n": len(values), "cpu_ms": cpu_ms}
                figures[hop][kind] = got
                print(f"{loop} delay {delay_s * 1000:.0f} ms"
                      f"{' keep-awake' if keep_awake else ''} {kind:6s} {hop:7s} - direct: "
                      f"p50 {got['p50']:.3f} ms, p90 {got['p90']:.3f}, p99 {got['p99']:.3f}; "
                      f"its CPU {cpu_ms:.3f} ms a request", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.03])
    parser.add_argument("--keep-awake", action="store_true")
    parser.add_argument("--loops", nargs="+", default=["asyncio"], choices=["asyncio", "uvloop"])
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)  # role, port, arg, loop
    args = parser.parse_args()
    if args.serve:
        role, port, arg, loop = args.serve
        serve(role, int(port), arg, loop)
        return
    awake = [False, True] if args.keep_awake else [False]
    runs = {f"{loop},delay={delay}{',keep-awake' if a else ''}": measure(delay, args.pairs, a, loop)
            for delay in args.delays for a in awake for loop in args.loops}
    out = results_path("gateway-proxy")
    out.write_text(json.dumps({"pairs": args.pairs, "runs": runs}, indent=2) + "\n")
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
