"""What each rank of one launch runs: argv, env and the files it reads, on which node.

This is what `mlx.launch` would do, done by us so each rank is a process we own:
ring ranks get MLX_RANK and MLX_HOSTFILE (JSON `[["ip:port"], ...]`, one list per rank);
jaccl ranks get MLX_RANK, MLX_JACCL_COORDINATOR, MLX_IBV_DEVICES (the JSON matrix of
device names, null on the diagonal) and MLX_METAL_FAST_SYNCH=1.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

import msgspec
import tomli_w

from orchestrator.config import ClusterSpec, NodeSpec
from serving.settings import RankSettings

SETTINGS_FILE = "settings.json"
HOSTFILE = "hostfile.json"
DEVICES_FILE = "ibv_devices.json"
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


def new_launch_id() -> str:
    """Sortable and unique: start time plus randomness, carried in every rank's env and logs."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def rank0_api_host(spec: ClusterSpec) -> str:
    """Rank 0's internal API listens on loopback when it runs here: only the gateway reaches it."""
    first = spec.nodes[0]
    return "127.0.0.1" if first.transport == "local" else first.rank_ip


def rank0_url(spec: ClusterSpec) -> str:
    return f"http://{rank0_api_host(spec)}:{spec.serving.rank_api_port}"


def build_plan(spec: ClusterSpec, launch_id: str) -> LaunchPlan:
    settings = _settings(spec, launch_id)
    files = {SETTINGS_FILE: msgspec.json.encode(settings).decode()}
    if spec.world_size == 1:
        pass
    elif spec.cluster.backend == "ring":
        files[HOSTFILE] = json.dumps(_hostfile(spec))
    else:
        files[DEVICES_FILE] = json.dumps([node.rdma for node in spec.nodes])
    ranks = [
        RankLaunch(
            rank=rank,
            node=node.name,
            argv=[node.python_executable, "-m", "serving", "--settings", SETTINGS_FILE],
            env=_env(spec, node, rank, launch_id),
            cwd=node.workdir or f"{RUNS_DIR}/{spec.cluster.name}/{launch_id}/rank{rank}",
            files=files,
        )
        for rank, node in enumerate(spec.nodes)
    ]
    return LaunchPlan(
        cluster=spec.cluster.name,
        backend=spec.cluster.backend,
        launch_id=launch_id,
        world_size=spec.world_size,
        api_url=f"http://{spec.api.host}:{spec.api.port}/v1",
        rank0_url=rank0_url(spec),
        ranks=ranks,
    )


def _settings(spec: ClusterSpec, launch_id: str) -> RankSettings:
    serving = spec.serving
    return RankSettings(
        model=spec.model.path,
        served_model_id=spec.model.served_id,
        context_length=spec.model.context_length,
        api_host=rank0_api_host(spec),
        api_port=serving.rank_api_port,
        max_batch_size=serving.max_batch_size,
        max_tokens_default=serving.max_tokens_default,
        max_tokens_limit=serving.max_tokens_limit,
        keepalive_s=serving.keepalive_s,
        request_timeout_s=serving.request_timeout_s,
        queue_limit=serving.queue_limit,
        launch_id=launch_id,
        shutdown_grace_s=spec.supervisor.stop_grace_s,
    )


def _hostfile(spec: ClusterSpec) -> list[list[str]]:
    return [
        [f"{node.rank_ip}:{spec.cluster.rank_port + rank}"] for rank, node in enumerate(spec.nodes)
    ]


def _env(spec: ClusterSpec, node: NodeSpec, rank: int, launch_id: str) -> dict[str, str]:
    env = dict(node.env)
    env.update({"MLX_LAUNCH_ID": launch_id, "PYTHONUNBUFFERED": "1"})
    if spec.world_size == 1:
        return env  # no distributed env: the rank runs alone, without a backend
    env["MLX_RANK"] = str(rank)
    if spec.cluster.backend == "ring":
        env["MLX_HOSTFILE"] = HOSTFILE
    else:
        env["MLX_JACCL_COORDINATOR"] = f"{spec.nodes[0].rank_ip}:{spec.cluster.rank_port}"
        env["MLX_IBV_DEVICES"] = DEVICES_FILE
        env.setdefault("MLX_METAL_FAST_SYNCH", "1")
    return env


def plan_as_toml(plan: LaunchPlan) -> str:
    """The plan for `orchestrator plan` / `up --dry-run`, secret-looking env values masked."""
    data: dict[str, Any] = msgspec.to_builtins(plan)
    for rank in data["ranks"]:
        rank["env"] = {k: "***" if _SECRET_NAME.search(k) else v for k, v in rank["env"].items()}
    return tomli_w.dumps(data)
