"""Rank 0's `serving_*` metrics in the gateway's /metrics, so the cluster is one target.

One instance: rank 0's text as it is. Several: each ready instance's rank 0, its series
labelled `model_instance` and merged family by family (orchestrator/instance_metrics.py).
"""

from __future__ import annotations

import asyncio

import aiohttp

from orchestrator.gateway.proxy import TRANSPORT_ERRORS
from orchestrator.gateway.routing import ModelRouter
from orchestrator.gateway.view import ClusterView
from orchestrator.instance_metrics import labelled_text
from orchestrator.supervision.state import GangState


async def rank0_metrics(
    client: aiohttp.ClientSession, view: ClusterView, router: ModelRouter | None
) -> bytes:
    if router is None:
        return await _one(client, view)
    replicas = [replica for route in router.routes.values() for replica in route.replicas]
    texts = await asyncio.gather(*(_one(client, replica.view) for replica in replicas))
    return labelled_text({r.name: text for r, text in zip(replicas, texts, strict=True)})


async def _one(client: aiohttp.ClientSession, view: ClusterView) -> bytes:
    if view.state != GangState.READY:
        return b""
    upstream = await view.wait_for_upstream(0.0)
    if upstream is None:
        return b""
    try:
        async with client.get(
            f"{upstream.url}/metrics", timeout=aiohttp.ClientTimeout(total=2.0)
        ) as response:
            return await response.read() if response.status == 200 else b""
    except TRANSPORT_ERRORS:
        return b""
