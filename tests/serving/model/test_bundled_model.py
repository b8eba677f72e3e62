"""bundled: model specs: GGUF conversion, the conversion cache and its lock, errors."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.bundled_models import BUNDLED_MODELS, UnknownBundledModel, bundled_gguf_path
from serving.model.bundled import (
    MARKER_FILE,
    ModelPathError,
    bundled_model_cache_path,
    file_sha256,
    prepare_bundled_model,
    resolve_model,
)
from testkit import paths

REPO = paths.ROOT
NAME = "smollm2-135m-instruct"

# One resolver process of the concurrency test: logs to stderr, prints its result.
RESOLVER = """
import json, logging, sys
from pathlib import Path
from serving.model.bundled import prepare_bundled_model
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
result = prepare_bundled_model(sys.argv[1], Path(sys.argv[2]))
print(json.dumps({"path": str(result.path), "converted": result.converted}))
"""


@pytest.mark.e2e  # loads and runs a model: seconds
def test_converted_model_loads_quantized_and_answers_paris(bundled_quantized_dir: Path) -> None:
    """mlx-lm loads the conversion (8-bit embedding, 4-bit layers) and answers the demo prompt."""
    import mlx.nn as nn
    from mlx_lm import generate, load
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer, *_ = load(str(bundled_quantized_dir))
    embed = model.model.embed_tokens
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(embed, nn.QuantizedEmbedding) and embed.bits == 8
    assert isinstance(q_proj, nn.QuantizedLinear) and (q_proj.bits, q_proj.group_size) == (4, 32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    answer = generate(model, tokenizer, prompt, max_tokens=24, sampler=make_sampler(temp=0.0))
    assert "Paris" in answer, answer


def test_float32_copy_is_the_dequantized_model(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """The float32 variant (for OpenBLAS) holds the same weights unquantized, its own config
    and the tokenizer files, in its own cache entry made from the quantized one."""
    import mlx.core as mx

    cache = bundled_quantized_dir.parent
    f32 = resolve_model(f"bundled:{NAME}", cache, float32=True)
    assert f32.name == bundled_quantized_dir.name + "-f32"
    config = json.loads((f32 / "config.json").read_text(encoding="utf-8"))
    assert "quantization" not in config and config["torch_dtype"] == "float32"
    weights = mx.load(str(f32 / "model.safetensors"))
    assert isinstance(weights, dict)
    assert {w.dtype for w in weights.values()} == {mx.float32}
    embed = weights["model.embed_tokens.weight"]
    assert embed.shape == (config["vocab_size"], config["hidden_size"])
    for name in ("tokenizer.json", "tokenizer_config.json", "conversion.json"):
        assert (f32 / name).is_file(), name


def test_converted_tokenizer_matches_gguf_specials(bundled_model_dir: Path) -> None:
    """Chat template, EOS and digit splitting come through the conversion."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(bundled_model_dir)
    assert tokenizer.eos_token_ids == {2}
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # SmolLM2's pre-tokenizer splits numbers into single digits.
    assert len(tokenizer.encode("2024")) == 4
    assert tokenizer.decode(tokenizer.encode("Hello, world! 42")) == "Hello, world! 42"


def test_second_resolution_reuses_the_cache(tmp_path: Path) -> None:
    """The first call converts; the second returns the same files untouched."""
    target = bundled_model_cache_path(NAME, tmp_path)
    stale = tmp_path / f".{target.name}.tmp-crashed"
    stale.mkdir()  # what a conversion killed mid-way leaves behind

    first = prepare_bundled_model(NAME, tmp_path)
    weights = first.path / "model.safetensors"
    before = weights.stat()
    second = prepare_bundled_model(NAME, tmp_path)

    assert first.converted and not second.converted
    assert first.path == second.path == target
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
    )
    assert not stale.exists()
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["sha256"] == file_sha256(bundled_gguf_path(NAME))
    assert resolve_model(f"bundled:{NAME}", tmp_path) == target


def test_concurrent_resolutions_convert_once(tmp_path: Path) -> None:
    """Two processes blocked on the lock both get a complete model; one converts."""
    target = bundled_model_cache_path(NAME, tmp_path)
    procs: list[subprocess.Popen[str]] = []
    logs = [tmp_path / f"resolver{i}.log" for i in range(2)]
    try:
        with (tmp_path / f"{target.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # hold it so both resolvers must wait
            for log in logs:
                with log.open("w") as err:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-c", RESOLVER, NAME, str(tmp_path)],
                            cwd=REPO,
                            stdout=subprocess.PIPE,
                            stderr=err,
                            text=True,
                        )
                    )
            _wait_for(lambda: all("waiting for another process" in p.read_text() for p in logs))
            fcntl.flock(lock, fcntl.LOCK_UN)
        results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(r["converted"] for r in results) == [False, True]
    assert {r["path"] for r in results} == {str(target)}
    assert (target / MARKER_FILE).is_file() and (target / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_unknown_bundled_name_lists_known_ones(tmp_path: Path) -> None:
    """An unknown bundled name fails and names every known bundled model."""
    with pytest.raises(UnknownBundledModel) as excinfo:
        resolve_model("bundled:llama-9000", tmp_path)
    for name in BUNDLED_MODELS:
        assert f"bundled:{name}" in str(excinfo.value)
    assert not list(tmp_path.iterdir())


def test_missing_path_is_reported(tmp_path: Path) -> None:
    """A local spec that does not exist, is a file, or lacks config.json is refused."""
    with pytest.raises(ModelPathError, match="does not exist"):
        resolve_model(str(tmp_path / "no-such-model"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelPathError, match="not a directory"):
        resolve_model(str(tmp_path / "file"))
    with pytest.raises(ModelPathError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_local_directory_is_returned_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative or ~ path to a model directory comes back absolute."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("model") == tmp_path / "model"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model("~/model") == tmp_path / "model"


def _wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("resolvers never reported waiting for the lock")
        time.sleep(0.05)
