"""Benchmark: what encrypting the gateway -> rank 0 hop costs, per request and per token.

    .venv/bin/python bench/rank0_hop.py [--requests 400] [--streams 40]

A stand-in rank 0 (uvicorn, a bare ASGI app in a process of its own: a small JSON answer,
and a stream of `--tokens` SSE events) reached by the gateway's own client (a pooled
aiohttp session) three ways: plain HTTP (today's LAN hop, the floor), HTTPS with the
certificate pinned (orchestrator/tls.py, as rank 0 is now reached), and plain HTTP through
an SSH forwarded channel (asyncssh's forward_local_port on a real sshd of 127.0.0.1, the
alternative the issue named). Per path: the p50 of a whole small request, and a stream's
time per event (its whole time / events, p50 over the streams); the added cost is each
minus plain. Figures go to bench/results/rank0-hop-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from orchestrator.tls import pinned, self_signed  # noqa: E402
from orchestrator.transports.ssh import SshTransport  # noqa: E402
from testkit.ports import free_port  # noqa: E402
from testkit.sshd import run_sshd  # noqa: E402

SERVER = '''
import sys, uvicorn
tokens = int(sys.argv[2])
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(tokens):
            await send({"type": "http.response.body", "more_body": True,
                        "body": b'data: {"choices":[{"delta":{"content":" tok"}}]}\\n\\n'})
        await send({"type": "http.response.body", "body": b"data: [DONE]\\n\\n"})
    else:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"id":"x","choices":[]}'})
tls = sys.argv[3:] and {"ssl_keyfile": sys.argv[3], "ssl_certfile": sys.argv[4]} or {}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", **tls)
'''


async def measure(url: str, ssl: Any, requests: int, streams: int, tokens: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector) as client:
        body = b'{"model":"m","messages":[{"role":"user","content":"Hi"}]}'
        times = []
        for i in range(requests + 30):
            started = time.perf_counter()
            async with client.post(f"{url}/v1/chat", data=body, ssl=ssl) as reply:
                await reply.read()
            if i >= 30:
                times.append(time.perf_counter() - started)
        per_token = []
        for _ in range(streams):
            started = time.perf_counter()
            async with client.post(f"{url}/stream", data=body, ssl=ssl) as reply:
                async for _chunk in reply.content.iter_any():
                    pass
            per_token.append((time.perf_counter() - started) / tokens)
    return {"request_p50_ms": statistics.median(times) * 1e3,
            "per_token_p50_ms": statistics.median(per_token) * 1e3}


def start(port: int, tokens: int, *tls: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(tokens), *tls])
    time.sleep(1.5)
    return proc


async def through_ssh(sshd: Any, target_port: int, **kw: Any) -> dict[str, float]:
    transport = SshTransport(sshd.node())  # the connection an orchestrator holds to a node
    await transport.connect()
    try:
        listener = await transport.connection.forward_local_port(
            "127.0.0.1", 0, "127.0.0.1", target_port)
        try:
            return await measure(f"http://127.0.0.1:{listener.get_port()}", None, **kw)
        finally:
            listener.close()
    finally:
        await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    kw = {"requests": args.requests, "streams": args.streams, "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as tmp:
        key_pem, cert_pem = self_signed("bench")
        key, cert = Path(tmp) / "key.pem", Path(tmp) / "cert.pem"
        key.write_bytes(key_pem)
        cert.write_bytes(cert_pem)
        plain_port, tls_port = free_port(), free_port()
        servers = [start(plain_port, args.tokens),
                   start(tls_port, args.tokens, str(key), str(cert))]
        try:
            results = {
                "plain": asyncio.run(measure(f"http://127.0.0.1:{plain_port}", None, **kw)),
                "tls_pinned": asyncio.run(measure(f"https://127.0.0.1:{tls_port}",
                                                  pinned(cert_pem.decode()), **kw)),
            }
            sshd_dir = Path(tmp) / "sshd"
            sshd_dir.mkdir()
            with run_sshd(sshd_dir) as sshd:
                results["ssh_forward"] = asyncio.run(through_ssh(sshd, plain_port, **kw))
        finally:
            for server in servers:
                server.terminate()
                server.wait(10)
    base = results["plain"]
    print(f"{'path':<12} {'request p50 ms':>15} {'added':>8} {'per token ms':>13} {'added':>8}")
    for name, figures in results.items():
        figures["request_added_ms"] = figures["request_p50_ms"] - base["request_p50_ms"]
        figures["per_token_added_ms"] = figures["per_token_p50_ms"] - base["per_token_p50_ms"]
        print(f"{name:<12} {figures['request_p50_ms']:>15.3f} {figures['request_added_ms']:>8.3f}"
              f" {figures['per_token_p50_ms']:>13.4f} {figures['per_token_added_ms']:>8.4f}")
    out = results_path("rank0-hop")
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
