"""What each rank of one launch runs: argv, env and the files it reads, on which node.

This is what `mlx.launch` would do, done by us so each rank is a process we own:
ring ranks get MLX_RANK and MLX_HOSTFILE (JSON `[["ip:port"], ...]`, one list per rank);
jaccl ranks get MLX_RANK, MLX_JACCL_COORDINATOR and MLX_IBV_DEVICES (the JSON matrix of
device names, null on the diagonal; see config/links.py for a ring of cables, which adds
MLX_JACCL_RING). Never MLX_METAL_FAST_SYNCH: MLX's docs (ml-explore/mlx#4005) say it can
deadlock and leave the GPU wedged, so it is off unless [nodes.env] sets it.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import tomli_w

from contract import launch_secret, rank_env
from contract.fingerprint import NodeFingerprint, ranks_on_machine
from contract.placement import Placement
from contract.settings import RankSettings, encode_settings
from orchestrator.config import ClusterSpec, NodeSpec
from orchestrator.config.jaccl_devices import device_matrix, wants_ring_flag
from orchestrator.config.links import rank_addresses
from orchestrator.launch.launch_secret import new_secret
from orchestrator.tls import self_signed

RUNS_DIR = "~/.cache/mlx-cluster-orchestrator/runs"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


class RankLaunch(msgspec.Struct, kw_only=True):
    rank: int
    node: str
    argv: list[str]
    env: dict[str, str]
    cwd: str  # on the node; "~" is expanded there
    files: dict[str, str]  # name -> content, written into cwd before the rank starts


class LaunchPlan(msgspec.Struct, kw_only=True):
    cluster: str
    backend: str
    launch_id: str
    world_size: int
    api_url: str
    rank0_url: str
    ranks: list[RankLaunch]
    placement: Placement | None = None  # None: not decided (no fingerprints): tensor
    # Rank 0's API requires it (contract/launch_secret.py); new for every plan, so a
    # restarted gang never accepts the previous one's.
    secret: str = ""
    # Rank 0's TLS certificate (PEM), pinned by whoever calls it; "" when rank 0 runs on
    # this machine and listens on loopback only (plain HTTP).
    tls_cert: str = ""


def new_launch_id() -> str:
    """Sortable and unique: start time plus randomness, carried in every rank's env and logs."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def build_plan(
    spec: ClusterSpec,
    launch_id: str,
    fingerprints: Mapping[str, NodeFingerprint] | None = None,
    placement: Placement | None = None,
    sharing: Mapping[str, int] | None = None,
) -> LaunchPlan:
    """`fingerprints`: the nodes' latest, where taken (they tell which share a machine);
    `placement`: the split preflight decided (orchestrator/placement/); `sharing`: ranks
    per node's machine counted over every instance of the `up` (else this gang's)."""
    sharing = sharing if sharing is not None else ranks_on_machine(fingerprints or {})
    tls = spec.nodes[0].transport != "local"  # rank 0 is reached over the network
    settings = RankSettings(
        model=spec.model,
        serving=spec.serving,
        api_host=spec.rank0_api_host,
        shutdown_grace_s=spec.supervisor.stop_grace_s,
        pipeline_split=placement.pipeline_split if placement else None,
        api_secret_file=launch_secret.FILE,
        kv_budget_bytes=_kv_budgets(spec, placement),
        api_tls_key_file=launch_secret.TLS_KEY_FILE if tls else None,
        api_tls_cert_file=launch_secret.TLS_CERT_FILE if tls else None,
    )
    secret = new_secret()
    rank0_files = {launch_secret.FILE: secret}
    key_pem, cert_pem = self_signed("mlxco-rank0") if tls else (b"", b"")
    if tls:
        rank0_files[launch_secret.TLS_KEY_FILE] = key_pem.decode()
        rank0_files[launch_secret.TLS_CERT_FILE] = cert_pem.decode()
    files = {rank_env.SETTINGS_FILE: encode_settings(settings).decode()}
    if spec.world_size == 1:
        pass
    elif spec.cluster.backend == "ring":
        files[rank_env.HOSTFILE_NAME] = json.dumps(_hostfile(spec))
    else:
        files[rank_env.DEVICES_FILE] = json.dumps(device_matrix(spec))
    ranks = [
        RankLaunch(
            rank=rank,
            node=node.name,
            argv=[node.python_executable, "-m", "serving", "--settings", rank_env.SETTINGS_FILE],
            env=_env(spec, node, rank, launch_id, sharing.get(node.name)),
            cwd=node.workdir or f"{RUNS_DIR}/{spec.cluster.name}/{launch_id}/rank{rank}",
            # Only rank 0 serves the API: only it holds the secret.
            files={**files, **rank0_files} if rank == 0 else files,
        )
        for rank, node in enumerate(spec.nodes)
    ]
    return LaunchPlan(
        cluster=spec.cluster.name,
        backend=spec.cluster.backend,
        launch_id=launch_id,
        world_size=spec.world_size,
        api_url=f"http://{spec.api.host}:{spec.api.port}/v1",
        rank0_url=spec.rank0_url.replace("http://", "https://", 1) if tls else spec.rank0_url,
        ranks=ranks,
        placement=placement,
        secret=secret,
        tls_cert=cert_pem.decode(),
    )


def _kv_budgets(spec: ClusterSpec, placement: Placement | None) -> list[int] | None:
    """Each rank's KV budget as preflight placed it, unless kv_cache_gb sets it."""
    if spec.serving.kv_cache_gb is not None or placement is None:
        return None
    budgets = [share.kv_budget_bytes for share in placement.ranks]
    return None if None in budgets else [b for b in budgets if b is not None]


def _hostfile(spec: ClusterSpec) -> list[list[str]]:
    """MLX's ring hostfile: each rank's listen addresses (see config/links.py)."""
    return [
        [f"{address.ip}:{spec.cluster.rank_port + rank}" for address in addresses]
        for rank, addresses in enumerate(rank_addresses(spec))
    ]


def _env(
    spec: ClusterSpec, node: NodeSpec, rank: int, launch_id: str, sharing: int | None
) -> dict[str, str]:
    env = dict(node.env)
    env.update({rank_env.LAUNCH_ID: launch_id, "PYTHONUNBUFFERED": "1"})
    env[rank_env.HF_HUB_OFFLINE] = "1"
    if sharing is not None:  # else the rank guesses from its hostfile (serving/blas.py)
        env[rank_env.RANKS_ON_MACHINE] = str(sharing)
    if spec.world_size == 1:
        return env  # no distributed env: the rank runs alone, without a backend
    env[rank_env.RANK] = str(rank)
    if spec.cluster.backend == "ring":
        env[rank_env.HOSTFILE] = rank_env.HOSTFILE_NAME
    else:
        env[rank_env.JACCL_COORDINATOR] = f"{spec.nodes[0].rank_ip}:{spec.cluster.rank_port}"
        env[rank_env.IBV_DEVICES] = rank_env.DEVICES_FILE
        if wants_ring_flag(spec):  # as `mlx.launch --backend jaccl-ring` does
            env[rank_env.JACCL_RING] = "1"
    return env


def plan_as_toml(plan: LaunchPlan) -> str:
    """The plan for `orchestrator plan` / `up --dry-run`, secret-looking env values masked."""
    return tomli_w.dumps(_shown(plan))


def plan_as_json(plan: LaunchPlan) -> str:
    """`orchestrator plan --json`: the same, for scripts."""
    return json.dumps(_shown(plan), indent=2) + "\n"


def instance_plans_text(plans: list[tuple[str, LaunchPlan]], as_json: bool) -> str:
    """Several instances' plans: {"instances": [{"instance": NAME, <its plan>}, ...]}."""
    data = {"instances": [{"instance": name} | _shown(plan) for name, plan in plans]}
    return json.dumps(data, indent=2) + "\n" if as_json else tomli_w.dumps(data)


def _shown(plan: LaunchPlan) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(plan)
    data["secret"] = "***"
    if data["tls_cert"]:  # public, but pages long: the files below carry it
        data["tls_cert"] = "(made for this launch)"
    if data.get("placement") is None:
        data.pop("placement", None)  # TOML has no null
    for rank in data["ranks"]:
        rank["env"] = {k: "***" if _SECRET_NAME.search(k) else v for k, v in rank["env"].items()}
        for name in (launch_secret.FILE, launch_secret.TLS_KEY_FILE):
            if name in rank["files"]:
                rank["files"][name] = "***"
    return data
