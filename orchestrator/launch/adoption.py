"""Adopting the gang a previous orchestrator left running (it crashed, was killed, upgraded).

    connect (agents reached on their sockets) ─▶ each agent's ranks and launch record
      ─▶ same launch on the record's nodes (every node, or those a re-plan on fewer nodes
         kept), every rank running, same config, rank code and model?
           yes ─▶ Adopt: the gang serves on, no model load
           no  ─▶ say why, stop those ranks (each agent's own children), launch afresh

The agents' LaunchRecord (contract/adoption.py) is where per-launch data comes from.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping

import msgspec

from contract.adoption import LaunchRecord
from contract.agent_protocol import RankList
from contract.fingerprint import NodeFingerprint
from node_agent.code_digest import code_digest, code_root, package_files
from orchestrator.config import ClusterSpec
from orchestrator.launch import launch_secret
from orchestrator.launch.gang import Gang
from orchestrator.launch.plan import LaunchPlan, build_plan
from orchestrator.placement.remaining import without
from orchestrator.transports import AgentRequestError, TransportError
from orchestrator.transports.pool import NodePool

log = logging.getLogger(__name__)

RANK_PACKAGES = ("contract", "serving")  # what a rank imports: an orchestrator-only change
# (orchestrator/, node_agent/) leaves the ranks adoptable


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def config_digest(spec: ClusterSpec) -> str:
    return _digest(msgspec.json.encode(spec))


def rank_code_digest() -> str:
    root = code_root()
    return code_digest(root, package_files(root, RANK_PACKAGES))


def model_digest(spec: ClusterSpec, fingerprints: Mapping[str, NodeFingerprint]) -> str:
    def one(name: str) -> str:
        model = fingerprints[name].model if name in fingerprints else None
        return f"{name}={model.digest if model else None}"

    return _digest("\n".join(one(node.name) for node in spec.nodes).encode())


def launch_record(
    spec: ClusterSpec,
    plan: LaunchPlan,
    fingerprints: Mapping[str, NodeFingerprint],
    gang: ClusterSpec | None = None,
) -> LaunchRecord:
    """`spec`: cluster.toml's (the instance's); `gang`: the spec the gang runs when it
    was re-planned on fewer nodes (fewer_nodes.py), else `spec`."""
    gang = gang or spec
    return LaunchRecord(
        launch_id=plan.launch_id,
        config_digest=config_digest(spec),
        code_digest=rank_code_digest(),
        model_digest=model_digest(gang, fingerprints),
        placement=plan.placement,
        nodes=[node.name for node in gang.nodes],
    )


def left_out(spec: ClusterSpec, record: LaunchRecord) -> list[str]:
    """cluster.toml's nodes the gang of `record` does not run on: those a re-plan on fewer
    nodes left out; [] for a gang on every node (or an older record, which names none)."""
    if not record.nodes:
        return []
    return [node.name for node in spec.nodes if node.name not in record.nodes]


def gang_spec(spec: ClusterSpec, record: LaunchRecord) -> ClusterSpec | str:
    """The spec of the gang `record` describes: `spec` (cluster.toml's), or, for a gang
    re-planned on fewer nodes, `spec` less the nodes it left out (as fewer_nodes.py made
    it); a str says why the record's nodes cannot be cluster.toml's."""
    names = [node.name for node in spec.nodes]
    if record.nodes and [name for name in names if name in record.nodes] != record.nodes:
        return (f"launch {record.launch_id} runs on {', '.join(record.nodes)}: not nodes "
                f"of cluster.toml ({', '.join(names)}) in their order")
    away = left_out(spec, record)
    return without(spec, away) if away else spec


def mismatch(
    spec: ClusterSpec,
    states: Mapping[str, RankList],
    fingerprints: Mapping[str, NodeFingerprint],
) -> str:
    """Why the running gang cannot be adopted ("" if it can)."""
    records = {name: state.launch for name, state in states.items()}
    for name, record in records.items():
        if record is None:
            return f"the agent on {name} runs ranks but keeps no launch record"
    launches = {r.launch_id for r in records.values() if r is not None}
    if len(launches) != 1:
        return f"the nodes run different launches ({', '.join(sorted(launches))})"
    record = next(r for r in records.values() if r is not None)
    gang = gang_spec(spec, record)
    if isinstance(gang, str):
        return gang
    for rank, node in enumerate(gang.nodes):
        ranks = states[node.name].ranks if node.name in states else []
        if not any(i.rank == rank and i.launch_id == record.launch_id for i in ranks):
            return f"rank {rank} of launch {record.launch_id} no longer runs on {node.name}"
    checks = (
        ("cluster.toml", record.config_digest, config_digest(spec)),
        ("the ranks' code (contract, serving)", record.code_digest, rank_code_digest()),
        ("the model files", record.model_digest, model_digest(gang, fingerprints)),
    )
    for what, then, now in checks:
        if then != now:
            return f"{what} changed since launch {record.launch_id} ({then} -> {now})"
    return ""


async def adopt_or_clear(spec: ClusterSpec, pool: NodePool, clear: bool = True) -> Gang | None:
    """The running gang, adopted; None when there is none or it was ended (logged why).
    Only the connected nodes are asked: a gang re-planned on fewer nodes is adopted with
    the nodes it left out unreachable. `clear=False` (some node unreachable, so nothing
    launches now): a gang that cannot be adopted is left running, not ended."""
    names = [name for name, node in pool.nodes.items() if node.connected]
    replies = await asyncio.gather(*(pool.agent(name).launch_state() for name in names))
    states = {name: state for name, state in zip(names, replies, strict=True) if state.ranks}
    if not states:
        return None
    fingerprints = await pool.fingerprint_all(names)
    record = next((state.launch for state in states.values() if state.launch), None)
    why = mismatch(spec, states, fingerprints)
    kept = None
    if not why and record is not None:
        kept, why = _kept_secret(spec, record.launch_id)
    if why or record is None:
        if not clear:
            log.warning("not adopting the running gang: %s", why)
            return None
        log.warning("not adopting the running gang: %s; ending it and launching afresh", why)
        await asyncio.gather(*(_stop_all(pool, name, spec) for name in states))
        return None
    gang_of = gang_spec(spec, record)
    assert not isinstance(gang_of, str)  # mismatch said so otherwise
    plan = build_plan(gang_of, record.launch_id, fingerprints, record.placement)
    assert kept is not None
    # Rank 0 holds the launch's own secret and certificate: the gateway must send that
    # secret and pin that certificate, not the ones build_plan just made.
    plan.secret = kept.secret
    if plan.tls_cert:
        plan.tls_cert = kept.tls_cert
    gang = Gang(plan, pool, record)
    gang.adopt([info for state in states.values() for info in state.ranks])
    await asyncio.gather(*(pool.agent(name).adopt(record.launch_id) for name in states))
    since = min((s.orphaned_since for s in states.values() if s.orphaned_since), default=None)
    alone = f", without an orchestrator for {time.time() - since:.1f} s" if since else ""
    log.info("adopted launch %s: %d ranks serving on%s (no model load)",
             record.launch_id, len(gang.ranks), alone)
    return gang


def _kept_secret(
    spec: ClusterSpec, launch_id: str
) -> tuple[launch_secret.LaunchSecret | None, str]:
    """Rank 0's secret (and certificate) for the launch, as the head kept them; else why
    they cannot be had."""
    where = launch_secret.secret_path(spec.state_dir, spec.cluster.name)
    try:
        kept = launch_secret.load(spec.state_dir, spec.cluster.name, launch_id)
    except launch_secret.SecretFileError as exc:
        return None, str(exc)
    if kept is None:
        return None, f"this machine keeps no secret for launch {launch_id} ({where})"
    if spec.nodes[0].transport != "local" and not kept.tls_cert:
        return None, f"no TLS certificate kept for launch {launch_id} ({where}): an older version"
    return kept, ""


async def _stop_all(pool: NodePool, name: str, spec: ClusterSpec) -> None:
    try:
        await pool.agent(name).stop(None, spec.supervisor.stop_grace_s)
    except (TransportError, AgentRequestError) as exc:
        log.warning("[%s] stopping the ranks a previous run left: %s", name, exc)
