"""Rank 0's `serving_*` metrics in the gateway's /metrics, so the cluster is one target.

Each rank 0 is asked at most once a second (orchestrator/gateway/rank0_metrics.py). One
instance: rank 0's text as it is. Several: each ready instance's rank 0, its series
labelled `model_instance` and merged family by family (orchestrator/instance_metrics.py).
"""

from __future__ import annotations

import asyncio

import aiohttp

from orchestrator.gateway.rank0_metrics import Rank0Metrics
from orchestrator.gateway.routing import ModelRouter
from orchestrator.gateway.view import ClusterView
from orchestrator.instance_metrics import labelled_text


async def rank0_metrics(
    client: aiohttp.ClientSession, view: ClusterView, router: ModelRouter | None,
    caches: dict[str, Rank0Metrics],
) -> bytes:
    """Each ready rank 0's text, from its instance's short cache (`caches`, by name)."""
    if router is None:
        return await caches.setdefault("", Rank0Metrics()).text(view, client)
    replicas = [replica for route in router.routes.values() for replica in route.replicas]
    texts = await asyncio.gather(*(
        caches.setdefault(r.name, Rank0Metrics()).text(r.view, client) for r in replicas))
    return labelled_text({r.name: text for r, text in zip(replicas, texts, strict=True)})
