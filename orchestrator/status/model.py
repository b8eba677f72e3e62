"""What `/status` and `orchestrator status --json` report: one typed snapshot of the cluster."""

from __future__ import annotations

from msgspec import Struct, field

from contract.placement import Placement


class LayerRange(Struct, kw_only=True):
    """The model layers a pipeline rank holds: [start, end)."""

    start: int
    end: int


class NodeStatus(Struct, kw_only=True):
    name: str
    transport: str
    host: str
    connected: bool
    hostname: str = ""
    chip: str = ""
    os: str = ""
    # Live, from the agent's usage reports (0 until the first, and once they are stale).
    memory_total_bytes: int = 0
    memory_available_bytes: int = 0
    memory_ranks_bytes: int = 0  # resident memory of our ranks on the node
    load_1m: float | None = None
    usage_age_s: float | None = None  # seconds since the latest report; None: none yet
    usage_stale: bool = False  # the agent has been silent too long: figures withheld
    mlx_version: str = ""
    mlx_lm_version: str = ""
    blas: str = ""
    rdma: str = ""
    # This node's share of the model in pipeline mode (None: tensor parallel, an equal
    # slice of every layer on each rank). Filled by whoever places the pipeline's split.
    layers: LayerRange | None = None


class LinkStatus(Struct, kw_only=True):
    """A cable between two nodes' ranks, with what the last `orchestrator linktest` measured
    on it (None: not measured since the file was written, or never)."""

    a: str  # node names
    b: str
    gbs: float | None = None  # GB/s, one direction
    measured_at: float | None = None  # unix time of that linktest


class RankStatus(Struct, kw_only=True):
    rank: int
    node: str
    pid: int | None
    state: str  # running | starting | exited | stopped
    uptime_s: float = 0.0
    last_exit: str = ""
    instance: str = ""  # with [[instances]]: whose rank it is


class ServingStatus(Struct, kw_only=True):
    requests_running: int = 0
    requests_waiting: int = 0
    generation_tokens_total: int = 0
    tokens_per_second: float = 0.0
    ttft_p50_s: float | None = None  # time to first token, median since rank 0 started
    draft_tokens_total: int = 0  # speculative decoding: drafts verified since rank 0 started
    accepted_tokens_total: int = 0  # ... and drafts kept


class RestartEntry(Struct, kw_only=True):
    at: float  # unix time the failure was noticed
    cause: str
    summary: str


class InstanceStatus(Struct, kw_only=True):
    """One `[[instances]]` table's gang: its model, nodes, ranks, mode and supervision."""

    name: str
    model: str  # the id clients pass
    aliases: list[str] = []
    nodes: list[str] = []
    mode: str = ""  # tensor | pipeline, once placed
    state: str
    reason: str = ""
    launch_id: str = ""
    restarts: int = 0
    last_cause: str = ""
    ranks: list[RankStatus] = []
    serving: ServingStatus = field(default_factory=ServingStatus)


class ClusterStatus(Struct, kw_only=True):
    cluster: str
    state: str
    reason: str = ""
    api_url: str
    model: str
    backend: str
    launch_id: str = ""
    restarts: int = 0
    last_cause: str = ""
    orchestrator_pid: int
    nodes: list[NodeStatus] = []
    ranks: list[RankStatus] = []
    serving: ServingStatus = field(default_factory=ServingStatus)
    history: list[RestartEntry] = []  # the latest gang failures, oldest first
    placement: Placement | None = None  # tensor or pipeline, and each rank's share
    links: list[LinkStatus] = []  # the cables between ranks, for the page's drawing
    # With [[instances]]: each one (the fields above then sum or list them all).
    instances: list[InstanceStatus] = []
