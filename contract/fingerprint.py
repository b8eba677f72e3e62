"""Wire types of a node fingerprint (what the orchestrator's preflight checks).

Every probe that can fail is optional: a missing tool leaves its field None and
records why under `NodeFingerprint.unavailable[<probe>]`, never a crash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec
from msgspec import Struct

from contract.model_manifest import ManifestFile
from contract.model_shards import WeightShard

# Metal's default working-set cap is roughly this share of RAM when it could not be read.
METAL_DEFAULT_WIRED_SHARE = 0.75


class OsInfo(Struct, kw_only=True):
    system: str  # platform.system(): "Darwin", "Linux"
    name: str  # "macOS", "Debian GNU/Linux"
    version: str  # "15.7.2", "12"
    build: str | None = None  # macOS BuildVersion ("24G325")
    kernel: str  # uname release


class MemoryInfo(Struct, kw_only=True):
    total_bytes: int
    available_bytes: int | None = None


class PythonInfo(Struct, kw_only=True):
    version: str
    executable: str
    implementation: str


class NetInterface(Struct, kw_only=True):
    name: str
    addresses: list[str] = msgspec.field(default_factory=list)  # IPv4 and IPv6, no scope suffix
    is_up: bool | None = None


class RdmaPort(Struct, kw_only=True):
    port: int
    state: str  # "PORT_ACTIVE", "PORT_DOWN", ...
    active: bool
    link_layer: str | None = None
    active_mtu: str | None = None
    active_width: str | None = None  # only in `ibv_devinfo -v`
    active_speed: str | None = None  # only in `ibv_devinfo -v`


class RdmaDevice(Struct, kw_only=True):
    name: str  # "rdma_en2"
    transport: str | None = None  # "Thunderbolt (100)"
    node_guid: str | None = None
    ports: list[RdmaPort] = msgspec.field(default_factory=list)

    @property
    def active(self) -> bool:
        return any(p.active for p in self.ports)


class RdmaInfo(Struct, kw_only=True):
    # From `rdma_ctl status`: macOS's switch for RDMA over Thunderbolt.
    status: Literal["enabled", "disabled", "unavailable"]
    reason: str | None = None  # why "unavailable"
    device_names: list[str] = msgspec.field(default_factory=list)  # `ibv_devices`
    devices: list[RdmaDevice] = msgspec.field(default_factory=list)  # `ibv_devinfo -v`


class ModelConfigInfo(Struct, kw_only=True):
    """The numbers placement and preflight need from a model's config: head counts (tensor
    parallelism splits heads), and what sizes its layers and its KV cache per token.
    contract/model_config.py reads them from a config.json."""

    model_type: str | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    quantization_bits: int | None = None
    quantization_group_size: int | None = None
    head_dim: int | None = None  # set by Qwen3, gpt-oss...; else hidden / heads
    intermediate_size: int | None = None  # a dense MLP's width
    tie_word_embeddings: bool = False
    # Mixture of experts: routed experts per MoE layer, each moe_intermediate_size wide,
    # shared experts beside them, and the first layers that stay dense.
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    num_shared_experts: int = 0
    moe_intermediate_size: int | None = None
    first_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek V2/V3, Kimi K2): the KV cache holds one
    # compressed latent (kv_lora_rank) plus the rotary key part per token and layer.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Sliding-window layers keep at most sliding_window tokens of KV; layer_types names
    # each layer ("full_attention", "sliding_attention", "linear_attention").
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    dtype: str | None = None  # torch_dtype: the activations' (and so the KV cache's) dtype


class ModelInfo(Struct, kw_only=True):
    spec: str  # as configured: "bundled:name" or a path
    path: str | None = None  # resolved on this node (expanded)
    exists: bool = False
    kind: Literal["mlx_dir", "gguf", "missing", "unresolved"] = "missing"
    file_count: int = 0
    total_bytes: int = 0
    weight_bytes: int = 0  # *.safetensors (or the GGUF file)
    # Model directory: the first 16 hex digits of its manifest digest (contract/
    # model_manifest.py: every file's size and full SHA-256, cached on the node), so equal
    # digests on two nodes mean the same bytes. GGUF: its name, size and metadata section.
    digest: str | None = None
    config: ModelConfigInfo | None = None
    error: str | None = None
    # Model directory: every file it holds (a pipeline node may hold only its layers'
    # shards: preflight compares file by file) and the shards its index names.
    files: list[ManifestFile] = msgspec.field(default_factory=list)
    shards: list[WeightShard] | None = None


class DiskInfo(Struct, kw_only=True):
    path: str
    total_bytes: int
    free_bytes: int


class NodeFingerprint(Struct, kw_only=True):
    hostname: str
    os: OsInfo
    arch: str
    chip: str | None = None
    cpu_count: int | None = None
    # Linux: the running kernel's boot_id, the same in every namespace and container on it,
    # so nodes with equal ids share one machine's cores and memory (ranks_on_machine).
    boot_id: str | None = None
    memory: MemoryInfo | None = None
    gpu_wired_limit_mb: int | None = None  # macOS `iogpu.wired_limit_mb`; 0 = system default
    # macOS: Metal's recommendedMaxWorkingSetSize, what the GPU may wire by default.
    gpu_working_set_bytes: int | None = None
    blas: str = ""  # what MLX's matmuls run on (contract/blas.py describe_blas)
    python: PythonInfo
    # Distribution versions (None = not installed): mlx, mlx-lm, mlx-metal,
    # mlx-cluster-orchestrator.
    packages: dict[str, str | None] = msgspec.field(default_factory=dict)
    # Digest of the node_agent + serving code this agent runs (see code_digest.py).
    code_digest: str | None = None
    interfaces: list[NetInterface] = msgspec.field(default_factory=list)
    rdma: RdmaInfo | None = None
    model: ModelInfo | None = None
    disk: DiskInfo | None = None
    # probe name -> reason it could not run ("rdma": "rdma_ctl not found on PATH").
    unavailable: dict[str, str] = msgspec.field(default_factory=dict)

    def usable_memory_bytes(self) -> int | None:
        """What the model and its KV cache may use on this node (None: not measured).
        Linux: available memory. macOS: the GPU's wired limit (`iogpu.wired_limit_mb` when
        set, else Metal's recommended working set, else a share of RAM), at most what is
        available."""
        if self.memory is None:
            return None
        available = self.memory.available_bytes or self.memory.total_bytes
        if self.os.system != "Darwin":
            return available
        if self.gpu_wired_limit_mb:
            limit = self.gpu_wired_limit_mb * 1024**2
        elif self.gpu_working_set_bytes:
            limit = self.gpu_working_set_bytes
        else:
            limit = int(self.memory.total_bytes * METAL_DEFAULT_WIRED_SHARE)
        return min(available, limit)

    def addresses(self) -> set[str]:
        """Every address of every interface, to check a node owns its configured ip."""
        return {a for i in self.interfaces for a in i.addresses}


def ranks_on_machine(fingerprints: Mapping[str, NodeFingerprint]) -> dict[str, int]:
    """For each node whose boot_id is known, how many of these nodes run on its kernel, and
    so share its cores and memory (network namespaces or containers of one machine)."""
    return ranks_per_machine(fingerprints, fingerprints)  # one rank per node


def ranks_per_machine(
    rank_nodes: Iterable[str], fingerprints: Mapping[str, NodeFingerprint]
) -> dict[str, int]:
    """For each node whose boot_id is known, how many of these ranks (one node name per
    rank, of every instance of an `up`) run on its kernel: two one-rank replicas on one
    machine split its cores as two ranks of one gang do."""
    boot = {name: fp.boot_id for name, fp in fingerprints.items() if fp.boot_id}
    counts = Counter(boot[node] for node in rank_nodes if node in boot)
    return {name: counts[machine] for name, machine in boot.items() if counts[machine]}
