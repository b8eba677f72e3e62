"""`orchestrator models [cluster.toml]`: the models at this machine (the HF cache and the
cluster's [model] store), what each is, and the cluster's own model even before its pull
(its size from the hub's listing).

    HF cache, store ─▶ scan_cache_dir ─▶ each snapshot's config.json ─▶ ModelEntry
    cluster's hf: model not here ─▶ the hub's file listing (sizes), config.json ─▶ ModelEntry
    with a cluster file: fits_cluster(entry, spec) fills the "fits" column
    with [[instances]]: each instance's model among them, and a line per instance saying
    which model (its id) it serves on which nodes (`--json`: {"models", "instances"})
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound
from rich.table import Table
from rich.text import Text

from contract.model_config import ModelConfigError
from contract.model_ref import Hub, parse_model_ref
from orchestrator.config import ClusterSpec
from orchestrator.config.instances import instance_specs
from orchestrator.console import report_console
from orchestrator.models.fit import fit, fit_model
from orchestrator.models.hub import HubAccess, HubError
from orchestrator.models.location import hf_cache_dir, pinned_commit, store_dir
from orchestrator.models.model_read import read_model
from orchestrator.placement.stand_in import measured_here


@dataclass
class ModelEntry:
    name: str  # ORG/NAME, or a directory's path
    where: str  # "cache", "store", "hub" (not downloaded) or "dir"
    commit: str = ""
    refs: str = ""  # the revisions pinned to this commit ("main", "v1")
    size_bytes: int = 0  # on disk; from the hub's listing when where == "hub"
    architecture: str = ""
    quantization: str = ""  # "4-bit g32", or the weights' dtype
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    path: str = ""
    fits: str | None = None  # how it fits the cluster: see fits_cluster


def fits_cluster(entry: ModelEntry, spec: ClusterSpec) -> str | None:
    """Tensor, pipeline or refused, the weights per node and the largest context that
    fits (orchestrator/models/fit.py); None (shown as "?") without a readable config."""
    root = Path(entry.path) if entry.path else None
    if root is None:
        return None
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    weights = sum(p.stat().st_size for p in root.glob("*.safetensors")) or entry.size_bytes
    try:
        decided = fit(config, weights, spec, measured_here(spec), str(root / "config.json"))
    except ModelConfigError as exc:
        return f"refused: {exc}"
    return None if decided is None else decided.text()


def catalog(spec: ClusterSpec | None, access: HubAccess | None = None) -> list[ModelEntry]:
    """Every model at this machine, then the cluster's model if it is not among them."""
    roots = {hf_cache_dir(): "cache"}
    if spec is not None and spec.model.store:
        roots[store_dir(spec.model)] = "store"
    entries = [entry for root, where in roots.items() for entry in _scan(root, where)]
    if spec is not None:
        for one in _served(spec):  # the file's model, or each instance's (once per model)
            entries += _cluster_model(one, entries, access)
        for entry in entries:
            if entry.where != "hub":  # a hub entry's fit was read from the hub's config
                entry.fits = fits_cluster(entry, spec)
    return entries


def _served(spec: ClusterSpec) -> list[ClusterSpec]:
    if not spec.instances:
        return [spec]
    return list({one.model.path: one for one in instance_specs(spec).values()}.values())


def serving(spec: ClusterSpec) -> list[dict[str, object]]:
    """With [[instances]]: which instance serves which model (its id) on which nodes."""
    return [{"instance": name, "model": one.model.path, "id": one.model.served_id,
             "nodes": [node.name for node in one.nodes]}
            for name, one in instance_specs(spec).items() if spec.instances]


def _scan(root: Path, where: str) -> list[ModelEntry]:
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return []
    entries = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            entry = ModelEntry(repo.repo_id, where, rev.commit_hash, ",".join(sorted(rev.refs)))
            entry.size_bytes, entry.path = rev.size_on_disk, str(rev.snapshot_path)
            _describe(entry, Path(rev.snapshot_path) / "config.json")
            entries.append(entry)
    return entries


def _cluster_model(
    spec: ClusterSpec, known: list[ModelEntry], access: HubAccess | None
) -> list[ModelEntry]:
    path = spec.model.path
    ref = parse_model_ref(path)
    if not isinstance(ref, Hub):
        root = Path(path).expanduser()
        if not root.is_dir():
            return []
        entry = ModelEntry(path, "dir", path=str(root))
        entry.size_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        _describe(entry, root / "config.json")
        return [entry]
    commit = pinned_commit(spec.model)
    if any(e.name == ref.repo_id and (commit is None or e.commit == commit) for e in known):
        return []
    entry = ModelEntry(ref.repo_id, "hub", refs=ref.revision)
    try:  # the hub's listing and config.json: no weight is fetched
        read = read_model(spec.model, access or HubAccess.from_env())
    except HubError as exc:
        entry.quantization = f"(not here; the hub: {exc})"
        return [entry]
    assert read.info is not None  # read_model raises for a hub model it cannot read
    entry.commit, entry.size_bytes = read.path.rsplit("/", 1)[-1], read.info.total_bytes
    decided = fit_model(read.info, spec, measured_here(spec))
    entry.fits = None if decided is None else decided.text()
    return [entry]


def _describe(entry: ModelEntry, config_file: Path) -> None:
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        entry.architecture = "(no config.json)"
        return
    text = config.get("text_config") or {}  # multimodal models keep the LM's shape there

    def field(name: str) -> int | None:
        value = config.get(name, text.get(name))
        return value if isinstance(value, int) else None

    archs = config.get("architectures") or []
    entry.architecture = str(config.get("model_type") or (archs[0] if archs else "?"))
    entry.layers, entry.heads = field("num_hidden_layers"), field("num_attention_heads")
    entry.kv_heads = field("num_key_value_heads") or entry.heads
    quant = config.get("quantization") or config.get("quantization_config")
    if isinstance(quant, dict) and "bits" in quant:
        entry.quantization = f"{quant['bits']}-bit g{quant.get('group_size', '?')}"
    else:
        entry.quantization = str(config.get("torch_dtype") or config.get("dtype") or "?")


def models_command(spec: ClusterSpec | None, as_json: bool) -> int:
    entries = catalog(spec)
    served = serving(spec) if spec is not None else []
    if as_json:
        data: object = [asdict(e) for e in entries]
        if served:  # with [[instances]]: {"models": [...], "instances": [...]}
            data = {"models": data, "instances": served}
        print(msgspec.json.format(msgspec.json.encode(data)).decode())
        return 0
    for line in served:
        print(f"instance {line['instance']}: {line['model']} as {line['id']!r} on "
              f"{', '.join(map(str, line['nodes']))}")  # type: ignore[call-overload]
    if not entries:
        print(f"no models at this machine ({hf_cache_dir()})", file=sys.stderr)
        return 0
    table = Table(box=None, pad_edge=False)
    columns = ["model", "where", "revision", "size", "arch", "quant", "layers", "heads"]
    for column in columns + (["fits"] if spec is not None else []):
        table.add_column(column, justify="right" if column in {"size", "layers"} else "left")
    for e in entries:
        revision = f"{e.refs or '-'} {e.commit[:12]}".strip()
        heads = f"{e.heads}/{e.kv_heads}" if e.heads else ""
        size = f"{e.size_bytes / 1e9:.2f} GB" + (" (hub)" if e.where == "hub" else "")
        row = [e.name, e.where, revision, size, e.architecture, e.quantization]
        row += [str(e.layers or ""), heads] + ([e.fits or "?"] if spec is not None else [])
        table.add_row(*(Text(cell) for cell in row))  # no rich markup: [[nodes]] is text
    report_console().print(table)
    return 0
