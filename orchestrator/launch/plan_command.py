"""`orchestrator plan` (and `up --dry-run`): connect to every node, take its fingerprint,
decide the placement as `up` would, and print the launch plan. Nothing is started."""

from __future__ import annotations

import asyncio
import sys

from contract.fingerprint import NodeFingerprint
from contract.placement import Placement
from orchestrator.config import ClusterSpec
from orchestrator.launch.plan import build_plan, plan_as_json, plan_as_toml
from orchestrator.placement.decide import Refusal, place
from orchestrator.placement.kv_fit import fit_sentence
from orchestrator.transports.pool import NodePool

EXIT_OK, EXIT_REFUSED = 0, 2


def print_plan(spec: ClusterSpec, as_json: bool) -> int:
    prints, errors = asyncio.run(_fingerprints(spec))
    for error in errors:
        print(f"cannot reach node {error}", file=sys.stderr)
    if errors:
        return EXIT_REFUSED
    placement = place(spec, prints)
    if isinstance(placement, Refusal):
        print(f"[{placement.check}] {placement.node}: {placement.found}\n    fix: {placement.fix}",
              file=sys.stderr)
        return EXIT_REFUSED
    plan = build_plan(spec, "planned", prints, placement)
    print(plan_as_json(plan) if as_json else plan_as_toml(plan), end="")
    if placement is not None:
        print(fit_sentence(placement, spec.serving.max_batch_size), file=sys.stderr)
    else:
        print("placement: not decided (the model could not be read on "
              f"{spec.nodes[0].name}: see `orchestrator up`'s preflight)", file=sys.stderr)
    return EXIT_OK


async def _fingerprints(spec: ClusterSpec) -> tuple[dict[str, NodeFingerprint], list[str]]:
    pool = NodePool(spec, on_event=lambda _node, _event: None, on_lost=lambda _n, _i: None)
    try:
        errors = await pool.connect_all()
        if errors:
            return {}, [f"{e.node} ({e.kind}): {e.message}" for e in errors]
        return await pool.fingerprint_all(), []
    finally:
        await pool.close_all()


def describe(placement: Placement, max_batch_size: int) -> str:
    """One line per rank for logs: the mode, why, each rank's share, and the KV's fit."""
    lines = [f"placement: {placement.mode} ({placement.reason})"]
    for share in placement.ranks:
        layers = f"layers [{share.layers[0]}, {share.layers[1]}) " if share.layers else ""
        lines.append(f"  rank {share.rank} on {share.node}: {layers}"
                     f"{share.weight_bytes / 1024**3:.2f} GiB of weights"
                     + (f", {share.kv_sequences} full-context sequences of KV"
                        if share.kv_sequences is not None else ""))
    lines.append(f"  {fit_sentence(placement, max_batch_size)}")
    return "\n".join(lines)
