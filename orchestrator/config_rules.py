"""Rules of cluster.toml that span several fields (the per-field types are in config.py)."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Iterator

from orchestrator.config import ClusterSpec
from orchestrator.config_check import ConfigIssue
from orchestrator.launch_plan import rank0_api_host

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Home routers hand out these subnets; a Thunderbolt link there routes traffic the wrong way.
ROUTER_SUBNETS = (ipaddress.ip_network("192.168.0.0/24"), ipaddress.ip_network("192.168.1.0/24"))
# Variables the orchestrator sets for each rank; a node may not override them.
RESERVED_ENV = frozenset(
    {"MLX_RANK", "MLX_HOSTFILE", "MLX_JACCL_COORDINATOR", "MLX_IBV_DEVICES", "MLX_LAUNCH_ID"}
)


def semantic_issues(spec: ClusterSpec) -> list[ConfigIssue]:
    rules = (
        _node_names,
        _transports,
        _addresses,
        _endpoints,
        _rdma,
        _env,
        _api,
        _model,
        _limits,
    )
    return [issue for rule in rules for issue in rule(spec)]


def _node_names(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    if not spec.nodes:
        yield ConfigIssue("nodes", "no nodes", 'add a [[nodes]] table, e.g. name = "a"')
    seen: dict[str, int] = {}
    for index, node in enumerate(spec.nodes):
        if node.name in seen:
            yield ConfigIssue(
                f"nodes[{index}].name",
                f"{node.name!r} is already the name of nodes[{seen[node.name]}]",
                "give every node a unique name",
            )
        seen.setdefault(node.name, index)


def _transports(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        path = f"nodes[{index}]"
        if node.transport == "ssh" and not node.ssh:
            yield ConfigIssue(
                f"{path}.ssh",
                "transport is 'ssh' but no ssh target is set",
                'set ssh = "user@host" (or "host")',
            )
        if node.transport == "ssh" and node.ssh and node.ssh.startswith("-"):
            yield ConfigIssue(f"{path}.ssh", f"{node.ssh!r} starts with '-'", "give a host name")
        if node.transport == "local" and node.ssh:
            yield ConfigIssue(
                f"{path}.ssh",
                "is ignored with transport = 'local'",
                'set transport = "ssh" or remove ssh',
                "warning",
            )


def _addresses(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        path = f"nodes[{index}].ip"
        if node.ip is None:
            if spec.world_size > 1:
                yield ConfigIssue(
                    path,
                    f"missing: the {spec.cluster.backend} backend needs the address "
                    "other ranks reach this node at",
                    'set ip = "10.0.0.2" (the node\'s Thunderbolt address; 127.0.0.1 for '
                    "ranks on this machine)",
                )
            continue
        try:
            address = ipaddress.ip_address(node.ip)
        except ValueError:
            yield ConfigIssue(
                path,
                f"{node.ip!r} is not an IP address",
                'use a numeric address such as "10.0.0.2"',
            )
            continue
        if spec.cluster.backend == "jaccl" and any(address in net for net in ROUTER_SUBNETS):
            yield ConfigIssue(
                path,
                f"{node.ip} is in a subnet home routers use; the RDMA link's "
                "traffic may go through the router instead",
                "give the Thunderbolt link its own subnet, e.g. 10.0.0.0/24",
                "warning",
            )


def _endpoints(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    """Every (ip, port) a rank or the rank-0 API listens on must be unique and in range."""
    last_port = spec.cluster.rank_port + spec.world_size - 1
    if last_port > 65535:
        yield ConfigIssue(
            "cluster.rank_port",
            f"ranks would need ports up to {last_port}",
            f"use a rank_port at most {65536 - spec.world_size}",
        )
        return
    users: dict[tuple[str, int], list[str]] = defaultdict(list)
    for rank, node in enumerate(spec.nodes):
        users[(node.rank_ip, spec.cluster.rank_port + rank)].append(f"rank {rank} ({node.name})")
    if spec.nodes:
        rank0_ip = rank0_api_host(spec)
        users[(rank0_ip, spec.serving.rank_api_port)].append("serving.rank_api_port")
        if spec.nodes[0].transport == "local":
            users[(rank0_ip, spec.api.port)].append("api.port")
    for (ip, port), names in users.items():
        if len(names) > 1:
            yield ConfigIssue(
                "cluster.rank_port",
                f"{ip}:{port} is used by {' and '.join(names)}",
                "give each listener its own address or port (rank i uses rank_port + i)",
            )


def _rdma(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    size = spec.world_size
    for index, node in enumerate(spec.nodes):
        path = f"nodes[{index}].rdma"
        if spec.cluster.backend != "jaccl":
            if node.rdma is not None:
                yield ConfigIssue(
                    path,
                    "is only used by the jaccl backend",
                    'remove it or set cluster.backend = "jaccl"',
                    "warning",
                )
            continue
        example = _rdma_example(index, size)
        if node.rdma is None:
            yield ConfigIssue(
                path,
                "missing: jaccl needs this node's RDMA device towards each rank",
                f"set rdma = {example}",
            )
            continue
        if len(node.rdma) != size:
            yield ConfigIssue(
                path,
                f"has {len(node.rdma)} entries for {size} nodes",
                f"one entry per node, e.g. rdma = {example}",
            )
            continue
        for peer, device in enumerate(node.rdma):
            if peer == index and device is not None:
                yield ConfigIssue(
                    f"{path}[{peer}]",
                    f"{device!r} at the node's own index",
                    f'use "" at index {peer} (a node has no link to itself)',
                )
            if peer != index and not device:
                yield ConfigIssue(
                    f"{path}[{peer}]",
                    f"no device towards {spec.nodes[peer].name}",
                    'name the device, e.g. "rdma_en2" (ibv_devices lists them)',
                )


def _rdma_example(index: int, size: int) -> str:
    entries = ['""' if peer == index else f'"rdma_en{peer + 2}"' for peer in range(size)]
    return "[" + ", ".join(entries) + "]"


def _env(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        for key in node.env:
            path = f"nodes[{index}].env.{key}"
            if not ENV_NAME.match(key):
                yield ConfigIssue(
                    path,
                    f"{key!r} is not a valid environment variable name",
                    "use letters, digits and _, not starting with a digit",
                )
            elif key in RESERVED_ENV:
                yield ConfigIssue(path, "is set by the orchestrator for each rank", "remove it")
            elif key == "MLX_METAL_FAST_SYNCH":
                yield ConfigIssue(
                    path,
                    "the orchestrator already sets it for jaccl, where it is "
                    "faster on some setups; MLX's docs say it can deadlock",
                    "remove it unless you measured that you need it",
                    "warning",
                )


def _api(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    name = spec.api.api_key_env
    if name is not None and not ENV_NAME.match(name):
        yield ConfigIssue(
            "api.api_key_env",
            f"{name!r} is not a valid environment variable name",
            'name the variable, e.g. api_key_env = "ORCHESTRATOR_API_KEY"; never the key',
        )


def _model(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    from serving.bundled_model import BUNDLED_MODELS, BUNDLED_PREFIX

    path = spec.model.path
    if path.startswith(BUNDLED_PREFIX):
        name = path.removeprefix(BUNDLED_PREFIX)
        if name not in BUNDLED_MODELS:
            known = ", ".join(BUNDLED_PREFIX + known for known in BUNDLED_MODELS)
            yield ConfigIssue(
                "model.path", f"unknown bundled model {name!r}", f"use one of: {known}"
            )
    elif not path.strip():
        yield ConfigIssue("model.path", "is empty", "give the model directory's path on every node")
    if spec.model.id is not None and not spec.model.id.strip():
        yield ConfigIssue("model.id", "is empty", "remove it to use the model's directory name")


def _limits(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    serving, supervisor = spec.serving, spec.supervisor
    if serving.max_tokens_default > serving.max_tokens_limit:
        yield ConfigIssue(
            "serving.max_tokens_default",
            f"{serving.max_tokens_default} is above max_tokens_limit {serving.max_tokens_limit}",
            "lower it or raise max_tokens_limit",
        )
    if supervisor.backoff_initial_s > supervisor.backoff_max_s:
        yield ConfigIssue(
            "supervisor.backoff_initial_s",
            f"{supervisor.backoff_initial_s} is above backoff_max_s {supervisor.backoff_max_s}",
            "lower it or raise backoff_max_s",
        )
