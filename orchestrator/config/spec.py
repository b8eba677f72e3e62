"""cluster.toml: the typed spec of a cluster and its loader.

The spec (what the user asked for) is kept apart from running state, as in
torch.distributed.elastic's WorkerSpec. `[model]` and `[serving]` are the rank's own
settings tables (contract/settings.py). Loading reports every problem at once: see
`load.py` for the field-by-field conversion and `rules.py` for the rules across fields.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from contract.settings import (
    ModelSettings,
    NonNegativeSeconds,
    Port,
    PositiveSeconds,
    Section,
    ServingSettings,
)

Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]


class ClusterSection(Section):
    name: Name = "mlx-cluster"
    backend: Literal["ring", "jaccl"] = "ring"
    # Where `up` keeps its state file; `status` and `down` read it from there.
    state_dir: str = "~/.local/state/mlx-cluster-orchestrator"
    # Rank i listens on rank_port + i for the ring backend (jaccl: rank 0's coordinator port).
    rank_port: Port = 52100
    # How the model is split over the ranks (orchestrator/placement/): "tensor" (1/n of
    # every layer; heads must divide by n), "pipeline" (a range of layers each, weighted
    # by memory), or "auto": tensor where it works and fits, else pipeline.
    parallel: Literal["auto", "tensor", "pipeline"] = "auto"


class ApiSection(Section):
    host: str = "127.0.0.1"
    port: Port = 8000
    # Name of the environment variable holding the API key; unset means no auth, which
    # beyond loopback `up` refuses unless allow_no_key.
    api_key_env: str | None = None
    # Serve beyond loopback without a key (api_key_env left out or its variable unset);
    # `up` refuses otherwise.
    allow_no_key: bool = False


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
    # How long to wait for a node that cannot be reached (a Mac asleep or rebooting)
    # before serving on the nodes that remain, or failing; waiting spends no restart.
    node_wait_s: PositiveSeconds = 600.0
    # A node of a multi-node gang away past node_wait_s: serve on the nodes that remain
    # when the model fits them (re-planned), and on every node again once it answers.
    serve_on_fewer_nodes: bool = True
    # Keep one started-and-imported rank process per rank waiting for the next launch.
    standby_ranks: bool = True
    # When the orchestrator goes away (crash, kill, upgrade), each agent keeps its ranks
    # serving this long for a new `up` to adopt them without a reload; 0: end them at once.
    orphan_grace_s: NonNegativeSeconds = 300.0


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
    # A virtual environment `orchestrator bootstrap` makes and keeps on the node; when set,
    # the node's python is <venv>/bin/python (set one of python and venv).
    venv: str | None = None
    workdir: str | None = None
    rdma: list[str | None] | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    # The most memory (GiB) the model and its KV cache may use on this node: room kept
    # for other programs; placement weighs the pipeline split by it.
    memory_gb: Annotated[float, Meta(gt=0)] | None = None

    @property
    def rank_ip(self) -> str:
        """The address other ranks reach this node's rank at; a lone node may omit it."""
        return self.ip or "127.0.0.1"

    @property
    def ssh_host(self) -> str:
        """The host of `ssh` ("user@host", "host", "user@[::1]"): where the orchestrator
        reaches the node; "" when unset."""
        return (self.ssh or "").rpartition("@")[2].strip("[]")

    @property
    def python_executable(self) -> str:
        """The node's interpreter: its venv's, else ours for local nodes, `python3` on the
        PATH over SSH."""
        if self.python:
            return self.python
        if self.venv:
            return self.venv.rstrip("/") + "/bin/python"
        return sys.executable if self.transport == "local" else "python3"


class BootstrapSection(Section):
    """`orchestrator bootstrap`: a venv on each node holding this machine's versions."""

    # The venv of every ssh node that sets neither python nor venv (None: only nodes
    # with their own venv are bootstrapped).
    venv: str | None = None
    # Interpreters to make venvs from, tried in order; empty: python3.X, the Homebrew and
    # python.org paths (a non-interactive SSH shell does not search them), then python3.
    base_python: list[str] = msgspec.field(default_factory=list)
    # Where pushed wheels are kept on each node (reused by the next bootstrap).
    wheel_dir: str = "~/.cache/mlx-cluster-orchestrator/wheels"


Pair = Annotated[list[str], Meta(min_length=2, max_length=2)]


class LinkSpec(Section):
    """One cable of a ring: the two nodes it joins and, in the same order, each end's
    address on it (ring backend: a Thunderbolt ring of 3+ Macs has a subnet per cable, so a
    node has a different address towards each neighbour) or each end's RDMA device (jaccl:
    a ring of cables instead of a full mesh)."""

    between: Annotated[list[Name], Meta(min_length=2, max_length=2)]
    ips: Pair | None = None  # ring: required; jaccl: optional, not used by MLX's RDMA
    rdma: Pair | None = None  # jaccl only: "rdma_en3" on each end


class InstanceSpec(Section):
    """One `[[instances]]` table: a model served by its own gang on some of the nodes,
    supervised on its own (orchestrator/config/instances.py derives its ClusterSpec)."""

    name: Name  # unique; in logs, status, metrics (label model_instance), state file names
    model: str  # as [model] path
    nodes: list[Name]  # names from [[nodes]], in rank order
    id: str | None = None  # the id clients pass as `model`; default: as [model] id
    aliases: list[str] = msgspec.field(default_factory=list)  # more names routed here
    parallel: Literal["auto", "tensor", "pipeline"] | None = None  # default: [cluster]'s
    context_length: Annotated[int, Meta(gt=0)] | None = None
    # [serving] keys overriding the file's [serving] for this instance (ports excepted:
    # they are assigned per instance).
    serving: dict[str, Any] = msgspec.field(default_factory=dict)


class ClusterSpec(Section):
    nodes: list[NodeSpec]
    links: list[LinkSpec] = msgspec.field(default_factory=list)
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    api: ApiSection = msgspec.field(default_factory=ApiSection)
    serving: ServingSettings = msgspec.field(default_factory=ServingSettings)
    supervisor: SupervisorSection = msgspec.field(default_factory=SupervisorSection)
    preflight: PreflightSection = msgspec.field(default_factory=PreflightSection)
    bootstrap: BootstrapSection = msgspec.field(default_factory=BootstrapSection)
    # Several models or replicas, each its own gang; empty: one instance, [model] on every node.
    instances: list[InstanceSpec] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        # [bootstrap] venv is the default venv of ssh nodes that name no interpreter; a local
        # node keeps the orchestrator's own (the reference bootstrap copies) unless it sets one.
        for node in self.nodes:
            if node.transport == "ssh" and node.python is None and node.venv is None:
                node.venv = self.bootstrap.venv

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    @property
    def state_dir(self) -> Path:
        return Path(self.cluster.state_dir).expanduser()

    @property
    def rank0_api_host(self) -> str:
        """Where rank 0's internal API listens: loopback when it runs here (only the gateway
        reaches it), else the address the orchestrator reaches that node at (its SSH host,
        not a Thunderbolt link the orchestrator may have no route to)."""
        first = self.nodes[0]
        return "127.0.0.1" if first.transport == "local" else first.ssh_host or first.rank_ip

    @property
    def rank0_url(self) -> str:
        return f"http://{self.rank0_api_host}:{self.serving.rank_api_port}"
