"""What the node holds for the configured model: path, size, a cheap digest, head counts.

The digest never reads the weights: it covers the small files at the top of
the model directory (config, tokenizer, index, chat template) and each
`.safetensors` file's name, size and header (8-byte length + JSON header, which
lists every tensor's dtype, shape and offsets). Two nodes with equal digests
hold the same model unless a weight byte was altered in place.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from contract.bundled_models import BUNDLED_PREFIX, ModelResolutionError, bundled_gguf_path
from contract.fingerprint import ModelConfigInfo, ModelInfo
from node_agent.probes.gguf import GgufHeader, read_gguf_header

_SMALL_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
_SMALL_LIMIT = 64 << 20  # a tokenizer.json can be tens of MB; weights never end in these
_MAX_ST_HEADER = 100 << 20


def inspect_model(spec: str) -> ModelInfo:
    if spec.startswith(BUNDLED_PREFIX):
        return _inspect_bundled(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        return ModelInfo(spec=spec, path=str(path), error=f"{path} does not exist on this node")
    if path.is_file() and path.suffix == ".gguf":
        return inspect_gguf(spec, path)
    if not path.is_dir():
        return ModelInfo(spec=spec, path=str(path), exists=True, error=f"{path} is not a directory")
    return inspect_model_dir(spec, path)


def _inspect_bundled(spec: str) -> ModelInfo:
    name = spec[len(BUNDLED_PREFIX) :]
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
    files = sorted(p for p in path.rglob("*") if p.is_file())
    info.file_count = len(files)
    h = hashlib.sha256()
    try:
        for file in files:
            size = file.stat().st_size
            info.total_bytes += size
            rel = file.relative_to(path).as_posix()
            if file.suffix == ".safetensors":
                info.weight_bytes += size
                h.update(f"{rel}\0{size}\0".encode() + _safetensors_header(file))
            elif file.parent == path and file.suffix in _SMALL_SUFFIXES and size <= _SMALL_LIMIT:
                h.update(f"{rel}\0{size}\0".encode() + file.read_bytes())
    except (OSError, ValueError) as exc:
        info.error = f"cannot read model files: {exc}"
        return info
    info.digest = h.hexdigest()[:16]
    config_path = path / "config.json"
    if not config_path.is_file():
        info.error = f"{config_path} is missing: not an mlx-lm model directory"
        return info
    try:
        info.config = _hf_config(json.loads(config_path.read_text()))
    except (OSError, ValueError) as exc:
        info.error = f"cannot parse {config_path}: {exc}"
    return info


def _safetensors_header(file: Path) -> bytes:
    with file.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{file.name} is too short for a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_ST_HEADER:
            raise ValueError(f"{file.name}: implausible safetensors header length {length}")
        return raw + f.read(length)


def _hf_config(config: dict[str, Any]) -> ModelConfigInfo:
    # Multimodal configs keep the language model's numbers under text_config.
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else config

    def num(key: str) -> int | None:
        value = merged.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    quant = merged.get("quantization")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    heads = num("num_attention_heads")
    model_type = merged.get("model_type")
    return ModelConfigInfo(
        model_type=model_type if isinstance(model_type, str) else None,
        num_attention_heads=heads,
        # Llama-style configs omit it when there is no grouped-query attention.
        num_key_value_heads=num("num_key_value_heads") or heads,
        num_hidden_layers=num("num_hidden_layers"),
        hidden_size=num("hidden_size"),
        vocab_size=num("vocab_size"),
        max_position_embeddings=num("max_position_embeddings"),
        quantization_bits=bits if isinstance(bits, int) else None,
    )
