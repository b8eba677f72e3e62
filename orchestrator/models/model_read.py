"""A model's config and weight size read at this machine or from the hub, without any node:
what `plan --offline`, `up --dry-run --offline` and `models --fit` place.

    bundled:NAME        the GGUF's header, from the package installed here (a .gguf file too)
    hf:ORG/NAME pulled  the snapshot in this machine's cache (the pinned commit)
    hf:ORG/NAME         the hub's config.json and file listing only: no weight is fetched
    a directory         its config.json and safetensors sizes, if it is at this machine

The nodes are not asked: a directory that is only on the nodes is "not readable here".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.fingerprint import ModelInfo
from contract.model_config import config_info
from contract.model_ref import Bundled, Hub, ModelRefError, parse_model_ref
from contract.model_shards import INDEX_FILE, index_total_size
from contract.settings import ModelSettings
from node_agent.probes.model import inspect_model
from orchestrator.models.hub import HubAccess, remote_config, remote_listing
from orchestrator.models.location import head_snapshot, node_path, pinned_commit

WEIGHTS = "model*.safetensors"


@dataclass(frozen=True)
class ModelRead:
    info: ModelInfo | None  # None: not readable at this machine (`source` says why)
    path: str  # where the nodes hold it: an hf: model's pinned snapshot directory
    source: str  # where it was read from, for the operator


def read_model(model: ModelSettings, access: HubAccess | None = None) -> ModelRead:
    """Raises HubError when an hf: model is not pulled and the hub cannot tell."""
    try:
        ref = parse_model_ref(model.path)
    except ModelRefError as exc:
        return ModelRead(None, model.path, str(exc))
    if isinstance(ref, Hub):
        return _read_hub(model, ref, access)
    root = Path(model.path).expanduser()
    if isinstance(ref, Bundled) or (root.suffix == ".gguf" and root.is_file()):
        info = inspect_model(model.path)  # a GGUF: its header only
        where = "the bundled model's package" if isinstance(ref, Bundled) else str(root)
        return ModelRead(info if info.config else None, model.path,
                         info.error or f"{where} at this machine")
    if not (root / "config.json").is_file():
        return ModelRead(None, model.path, f"{root} is not a model directory at this machine")
    return _read_here(root, model.path, f"{root} at this machine")


def _read_hub(model: ModelSettings, ref: Hub, access: HubAccess | None) -> ModelRead:
    commit = pinned_commit(model)
    if commit is not None and (head_snapshot(model, commit) / "config.json").is_file():
        return _read_here(head_snapshot(model, commit), node_path(model, commit),
                          f"this machine's cache, commit {commit[:12]}")
    access = access or HubAccess.from_env()
    listing = remote_listing(ref, access, model.trust_remote_code)
    config = remote_config(ref, access, listing.commit)
    weights = sum(f.size for f in listing.files if Path(f.path).match(WEIGHTS))
    info = ModelInfo(spec=model.path, exists=True, kind="mlx_dir", weight_bytes=weights,
                     total_bytes=listing.total_bytes, config=config_info(config))
    return ModelRead(info, node_path(model, listing.commit),
                     f"{access.endpoint}'s config.json and file listing at commit "
                     f"{listing.commit[:12]} (not pulled; no weight downloaded)")


def _read_here(root: Path, path: str, source: str) -> ModelRead:
    try:
        return ModelRead(read_dir(root), path, source)
    except (OSError, ValueError) as exc:
        return ModelRead(None, path, f"{root}/config.json cannot be read: {exc}")


def read_dir(root: Path) -> ModelInfo:
    """A model directory's config and weight bytes (the shard index's total when it has
    one), without hashing its files as a node's probe does."""
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    weights = sum(p.stat().st_size for p in root.glob(WEIGHTS))
    index = root / INDEX_FILE
    if index.is_file():
        weights = index_total_size(index.read_text(encoding="utf-8")) or weights
    return ModelInfo(spec=str(root), path=str(root), exists=True, kind="mlx_dir",
                     weight_bytes=weights, config=config_info(config))
