"""Benchmark: clients that give up, then a fresh request (after vLLM's cancellation test).

Starts `orchestrator up` with one local rank (the bundled model by default), sends
--clients concurrent completions of --max-tokens tokens through the gateway, each client
giving up after --timeout-s, then at once one fresh 16-token request, and times: how long
until rank 0 holds no request (serving_requests_running + waiting = 0), and how long the
fresh request takes, next to the same fresh request on the idle cluster before.

    .venv/bin/python bench/cancellation.py [--model PATH|bundled:...] [--clients 200]

Figures go to bench/results/cancellation-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.settings import ModelSettings  # noqa: E402
from testkit.orchestrator_process import running, write_cluster  # noqa: E402


async def give_up(
    client: httpx.AsyncClient, url: str, body: dict[str, object], after: float
) -> str:
    try:
        reply = await client.post(f"{url}/v1/completions", json=body, timeout=after)
    except httpx.TimeoutException:
        return "gave up"
    return f"answered {reply.status_code}"


async def storm(
    url: str, model: str, clients: int, max_tokens: int, after: float
) -> dict[str, int]:
    body = {"model": model, "prompt": "Write a long story", "max_tokens": max_tokens}
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(limits=limits) as client:
        tries = (give_up(client, url, body, after) for _ in range(clients))
        outcomes = await asyncio.gather(*tries)
    return {o: outcomes.count(o) for o in set(outcomes)}


def pending(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1]) for line in text.splitlines()
        if line.startswith(("serving_requests_running ", "serving_requests_waiting "))
    )


def fresh(url: str, model: str) -> float:
    started = time.monotonic()
    body = {"model": model, "prompt": "Hello", "max_tokens": 16, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json=body, timeout=600).raise_for_status()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=500)
    parser.add_argument("--timeout-s", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mco-cancel-") as tmp:
        config = write_cluster(Path(tmp), args.model, [{"name": "a"}],
                               serving={"queue_limit": args.clients + 8},
                               supervisor={"standby_ranks": False})
        api = tomllib.loads(config.read_text())["api"]
        url = f"http://{api['host']}:{api['port']}"
        model = ModelSettings(path=args.model).served_id
        with running(config, url=url):
            idle = fresh(url, model)
            started = time.monotonic()
            outcomes = asyncio.run(
                storm(url, model, args.clients, args.max_tokens, args.timeout_s)
            )
            gave_up = time.monotonic()
            after = fresh(url, model)
            while pending(url) and time.monotonic() - gave_up < 120:
                time.sleep(0.1)
            drained = time.monotonic() - gave_up
    figures = {
        "clients": args.clients, "max_tokens": args.max_tokens, "timeout_s": args.timeout_s,
        "outcomes": outcomes, "storm_s": gave_up - started,
        "fresh_request_idle_s": idle, "fresh_request_after_s": after,
        "drained_after_s": drained,
    }
    out = results_path("cancellation")
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
