"""The cables the status page draws: which nodes' ranks talk to each other, and the GB/s
the last `orchestrator linktest` measured on each (kept in the state dir by linktest)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.config import ClusterSpec
from orchestrator.config.links import hops
from orchestrator.status.model import LinkStatus


def linktest_path(spec: ClusterSpec) -> Path:
    return spec.state_dir / f"{spec.cluster.name}.linktest.json"


def record_linktest(spec: ClusterSpec, links: Iterable[tuple[str, str, float]]) -> None:
    """Keep a finished linktest's per-link figures (from, to, GB/s) for the page."""
    path = linktest_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [{"from": source, "to": dest, "gbs": gbs} for source, dest, gbs in links]
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps({"at": time.time(), "links": kept}))
    temp.replace(path)


def cluster_links(spec: ClusterSpec) -> list[LinkStatus]:
    """Ring: each rank and the next; JACCL: every pair (a full mesh of RDMA cables). Each
    with the slower direction the last linktest measured, when it measured that pair."""
    names = [node.name for node in spec.nodes]
    if spec.cluster.backend == "jaccl":
        pairs = list(itertools.combinations(range(len(names)), 2))
    else:
        pairs = sorted({(min(h.src, h.dst), max(h.src, h.dst)) for h in hops(spec)})
    at, measured = _measured(spec)
    links = []
    for a, b in pairs:
        gbs = measured.get(frozenset((names[a], names[b])))
        links.append(LinkStatus(a=names[a], b=names[b], gbs=gbs,
                                measured_at=at if gbs is not None else None))
    return links


def _measured(spec: ClusterSpec) -> tuple[float | None, dict[frozenset[str], float]]:
    try:
        data = json.loads(linktest_path(spec).read_text())
        found: dict[frozenset[str], float] = {}
        for link in data["links"]:
            pair = frozenset((str(link["from"]), str(link["to"])))
            found[pair] = min(float(link["gbs"]), found.get(pair, float("inf")))
        return float(data["at"]), found
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}  # never run, or a file from another version: no figures
