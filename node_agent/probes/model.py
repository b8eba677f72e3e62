"""What the node holds for the configured model: path, size, digest, head counts.

A model directory's digest is its manifest's (contract/model_manifest.py): the SHA-256
of every file, weights included, each computed once and then taken from the hash cache
(node_agent/models/hashes.py) while the file is unchanged. Two nodes with equal digests
hold the same bytes; this is the manifest `orchestrator sync` copies by. A GGUF file
(the `bundled:` demo model) keeps a digest of its name, size and metadata section.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from contract.bundled_models import ModelResolutionError, bundled_gguf_path
from contract.fingerprint import ModelConfigInfo, ModelInfo
from contract.model_config import ModelConfigError, config_info
from contract.model_ref import Bundled, ModelRefError, parse_model_ref
from contract.model_shards import INDEX_FILE, ShardIndexError, index_total_size, parse_index
from node_agent.models.hashes import ModelFileError, build_manifest
from node_agent.probes.gguf import GgufHeader, read_gguf_header

DIGEST_CHARS = 16  # shown and compared by preflight; the manifest keeps all 64


def inspect_model(spec: str) -> ModelInfo:
    try:
        ref = parse_model_ref(spec)
    except ModelRefError as exc:  # a hub reference the head did not resolve
        return ModelInfo(spec=spec, kind="unresolved", error=str(exc))
    if isinstance(ref, Bundled):
        return _inspect_bundled(spec, ref.name)
    path = Path(spec).expanduser()
    if not path.exists():
        return ModelInfo(spec=spec, path=str(path), error=f"{path} does not exist on this node")
    if path.is_file() and path.suffix == ".gguf":
        return inspect_gguf(spec, path)
    if not path.is_dir():
        return ModelInfo(spec=spec, path=str(path), exists=True, error=f"{path} is not a directory")
    return inspect_model_dir(spec, path)


def _inspect_bundled(spec: str, name: str) -> ModelInfo:
    try:
        path = bundled_gguf_path(name)
    except ModelResolutionError as exc:  # unknown name, or the package missing: with a hint
        return ModelInfo(spec=spec, kind="unresolved", error=str(exc))
    if not path.is_file():
        return ModelInfo(spec=spec, path=str(path), error=f"{path} does not exist on this node")
    return inspect_gguf(spec, path)


def inspect_gguf(spec: str, path: Path) -> ModelInfo:
    size = path.stat().st_size
    info = ModelInfo(
        spec=spec,
        path=str(path),
        exists=True,
        kind="gguf",
        file_count=1,
        total_bytes=size,
        weight_bytes=size,
    )
    try:
        header = read_gguf_header(path)
    except (OSError, ValueError) as exc:
        info.error = f"cannot read GGUF header: {exc}"
        return info
    h = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        h.update(f.read(header.header_bytes))
    info.digest = h.hexdigest()[:16]
    info.config = _gguf_config(header)
    return info


def _gguf_config(header: GgufHeader) -> ModelConfigInfo:
    def num(suffix: str) -> int | None:
        value = header.arch_value(suffix)
        return int(value) if isinstance(value, int | float) else None

    arch = header.metadata.get("general.architecture")
    vocab = num("vocab_size") or header.array_lengths.get("tokenizer.ggml.tokens")
    return ModelConfigInfo(
        model_type=arch if isinstance(arch, str) else None,
        num_attention_heads=num("attention.head_count"),
        num_key_value_heads=num("attention.head_count_kv"),
        num_hidden_layers=num("block_count"),
        hidden_size=num("embedding_length"),
        vocab_size=vocab,
        max_position_embeddings=num("context_length"),
    )


def inspect_model_dir(spec: str, path: Path) -> ModelInfo:
    info = ModelInfo(spec=spec, path=str(path), exists=True, kind="mlx_dir")
    try:
        manifest, _stats = build_manifest(path)
    except ModelFileError as exc:
        info.error = f"cannot read model files: {exc}"
        return info
    info.file_count = len(manifest.files)
    info.total_bytes = manifest.total_bytes
    info.weight_bytes = sum(f.size for f in manifest.files if f.path.endswith(".safetensors"))
    info.digest = manifest.digest()[:DIGEST_CHARS]
    info.files = manifest.files
    index = path / INDEX_FILE
    if index.is_file():
        try:
            text = index.read_text()
            info.shards = parse_index(text)
        except (OSError, ShardIndexError) as exc:
            info.error = f"cannot read {index}: {exc}"
            return info
        # A pipeline node may hold some shards only: the index's total is the same on all.
        info.weight_bytes = index_total_size(text) or info.weight_bytes
    config_path = path / "config.json"
    if not config_path.is_file():
        info.error = f"{config_path} is missing: not an mlx-lm model directory"
        return info
    try:
        info.config = config_info(json.loads(config_path.read_text()), str(config_path))
    except ModelConfigError as exc:
        info.error = str(exc)  # names the file and the field
    except (OSError, ValueError) as exc:
        info.error = f"cannot parse {config_path}: {exc}"
    return info

