"""cluster.toml: the typed spec of a cluster and its loader.

The spec (what the user asked for) is kept apart from running state, as in
torch.distributed.elastic's WorkerSpec. Loading reports every problem at once:
see `config_check.py` for the field-by-field conversion and the semantic rules.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

Port = Annotated[int, Meta(ge=1, le=65535)]
PositiveInt = Annotated[int, Meta(ge=1)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
NonNegativeSeconds = Annotated[float, Meta(ge=0)]
Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"


class Section(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every config table: unknown keys are errors, so typos never pass silently."""


class ClusterSection(Section):
    name: Name = "mlx-cluster"
    backend: Literal["ring", "jaccl"] = "ring"
    # Where `up` keeps its state file; `status` and `down` read it from there.
    state_dir: str = "~/.local/state/mlx-cluster-orchestrator"
    # Rank i listens on rank_port + i for the ring backend (jaccl: rank 0's coordinator port).
    rank_port: Port = 52100


class ModelSection(Section):
    path: str = DEFAULT_MODEL
    # The id clients pass as `model`; defaults to the path's last component.
    id: str | None = None
    # Longest prompt + completion in tokens; None takes the model's own limit.
    context_length: PositiveInt | None = None

    @property
    def served_id(self) -> str:
        if self.id:
            return self.id
        return self.path.removeprefix("bundled:").rstrip("/").rsplit("/", 1)[-1]


class ApiSection(Section):
    host: str = "127.0.0.1"
    port: Port = 8000
    # Name of the environment variable holding the API key; unset means no auth.
    api_key_env: str | None = None


class ServingSection(Section):
    max_batch_size: PositiveInt = 8
    max_tokens_default: PositiveInt = 512
    max_tokens_limit: PositiveInt = 4096
    # Idle workers sleep most of this between keepalives (MLX's ring busy-polls in a
    # collective), so it bounds the first request's extra wait after an idle spell.
    keepalive_s: PositiveSeconds = 0.5
    request_timeout_s: PositiveSeconds = 600.0
    queue_limit: PositiveInt = 64
    # Rank 0's internal OpenAI API, on rank 0's node ip; the gateway proxies to it.
    rank_api_port: Port = 52200


class SupervisorSection(Section):
    backoff_initial_s: NonNegativeSeconds = 1.0
    backoff_max_s: NonNegativeSeconds = 60.0
    backoff_reset_after_s: PositiveSeconds = 600.0
    max_restarts: Annotated[int, Meta(ge=0)] = 5
    restart_window_s: PositiveSeconds = 600.0
    # RDMA resources of a killed JACCL job take ~30 s to be released.
    ebusy_cooldown_s: NonNegativeSeconds = 30.0
    hang_timeout_s: PositiveSeconds = 60.0
    launch_timeout_s: PositiveSeconds = 600.0
    stop_grace_s: NonNegativeSeconds = 10.0
    # Keep one started-and-imported rank process per rank waiting for the next launch.
    standby_ranks: bool = True


class PreflightSection(Section):
    # Memory each node keeps for the OS and other programs; the model's shard plus its
    # KV cache must fit in what is left.
    reserve_memory_gb: Annotated[float, Meta(ge=0)] = 2.0


class NodeSpec(Section):
    name: Name
    transport: Literal["local", "ssh"] = "local"
    ssh: str | None = None
    ssh_port: Port = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    # Off by default: an unknown host key is refused unless the user opts in.
    accept_new_host_keys: bool = False
    ip: str | None = None
    python: str | None = None
    workdir: str | None = None
    rdma: list[str | None] | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def rank_ip(self) -> str:
        """The address other ranks reach this node's rank at; a lone node may omit it."""
        return self.ip or "127.0.0.1"

    @property
    def python_executable(self) -> str:
        """The node's interpreter: ours for local nodes, `python3` on the PATH over SSH."""
        if self.python:
            return self.python
        return sys.executable if self.transport == "local" else "python3"


class ClusterSpec(Section):
    nodes: list[NodeSpec]
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    model: ModelSection = msgspec.field(default_factory=ModelSection)
    api: ApiSection = msgspec.field(default_factory=ApiSection)
    serving: ServingSection = msgspec.field(default_factory=ServingSection)
    supervisor: SupervisorSection = msgspec.field(default_factory=SupervisorSection)
    preflight: PreflightSection = msgspec.field(default_factory=PreflightSection)

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    @property
    def state_dir(self) -> Path:
        return Path(self.cluster.state_dir).expanduser()


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and check cluster.toml; raises ConfigErrors listing every problem."""
    from orchestrator.config_check import check_cluster_file

    spec, _warnings = check_cluster_file(Path(path))
    return spec
