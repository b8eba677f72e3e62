"""The tiny random Llama: deterministic, generates, and shards over real ring ranks; its
dense qwen3 variant loads through the pipeline adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.model.bundled import default_cache_dir
from testkit import paths
from testkit.ports import free_ports
from testkit.tiny_model import write_tiny_model

REPO = paths.ROOT
PROMPT = "Tell me a story about a robot."
MAX_TOKENS = 12

# One tensor-parallel rank: ring init, sharded_load, greedy tokens as JSON on stdout.
RANK = """
import json, sys
import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import sharded_load
group = mx.distributed.init(backend="ring", strict=True)
model, tokenizer = sharded_load(sys.argv[1])
prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": sys.argv[2]}], add_generation_prompt=True)
tokens = [r.token for r in stream_generate(
    model, tokenizer, prompt, max_tokens=int(sys.argv[3]), sampler=make_sampler(temp=0.0))]
print(json.dumps({"rank": group.rank(), "size": group.size(), "tokens": tokens,
                  "heads": model.model.layers[0].self_attn.n_heads,
                  "kv_heads": model.model.layers[0].self_attn.n_kv_heads}))
"""


def greedy_tokens(model_dir: Path, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> list[int]:
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer, *_ = load(str(model_dir))
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    sampler = make_sampler(temp=0.0)
    return [r.token for r in stream_generate(model, tokenizer, chat, max_tokens, sampler=sampler)]


@pytest.mark.e2e  # loads and runs a model: seconds
def test_tiny_model_generates_deterministically(tiny_model_dir: Path) -> None:
    """Greedy decoding runs to max_tokens (never EOS) and repeats exactly."""
    first = greedy_tokens(tiny_model_dir)
    assert len(first) == MAX_TOKENS
    assert len(set(first)) > 1  # not one token echoed forever
    assert greedy_tokens(tiny_model_dir) == first
    assert greedy_tokens(tiny_model_dir, prompt="Something else entirely") != first


def test_same_seed_same_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The weights are a function of the seed: equal for seed 0, different for seed 1."""
    cache = default_cache_dir()
    again = write_tiny_model(tmp_path / "again", model_cache_dir=cache)
    other = write_tiny_model(tmp_path / "other", seed=1, model_cache_dir=cache)
    weights = "model.safetensors"
    assert (again / weights).read_bytes() == (tiny_model_dir / weights).read_bytes()
    assert (other / weights).read_bytes() != (tiny_model_dir / weights).read_bytes()
    config = json.loads((again / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (8, 4)


def test_head_counts_must_divide(tmp_path: Path) -> None:
    """Head counts that cannot form a model are refused before anything is written."""
    with pytest.raises(ValueError, match="num_kv_heads"):
        write_tiny_model(tmp_path / "bad", num_heads=8, num_kv_heads=3)
    assert not (tmp_path / "bad").exists()


@pytest.mark.e2e
# 4 ranks of the tiny model through the serving ranks, processors and prefix cache too:
# tests/serving/model/test_tensor_parallel.py (4 ranks on 2 cores cost ~20 s a start).
@pytest.mark.parametrize("world_size", [2])
def test_tiny_model_shards_over_ring(tmp_path: Path, tiny_model_dir: Path, world_size: int) -> None:
    """sharded_load over real ring ranks on 127.0.0.1 splits the heads and every rank
    produces the single-process greedy tokens."""
    expected = greedy_tokens(tiny_model_dir)
    results = run_ring_ranks(tmp_path, world_size, [str(tiny_model_dir), PROMPT, str(MAX_TOKENS)])
    assert [r["rank"] for r in results] == list(range(world_size))
    for result in results:
        assert result["size"] == world_size
        assert (result["heads"], result["kv_heads"]) == (8 // world_size, 4 // world_size)
        assert result["tokens"] == expected


def run_ring_ranks(workdir: Path, world_size: int, args: list[str]) -> list[dict[str, object]]:
    """Run RANK in `world_size` processes forming a ring group; their JSON results."""
    hostfile = workdir / "hostfile.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in free_ports(world_size)]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["MLX_HOSTFILE"] = str(hostfile)
    procs: list[subprocess.Popen[str]] = []
    try:
        for rank in range(world_size):
            log = (workdir / f"rank{rank}.log").open("w")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", RANK, *args],
                    cwd=REPO,
                    env=dict(env, MLX_RANK=str(rank)),
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            )
            log.close()
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        log_text = (workdir / f"rank{rank}.log").read_text()
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log_text}"
    return [json.loads(out) for out in outputs]




def test_tiny_qwen3_loads_through_the_pipeline_adapter(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """The tiny dense qwen3 loads as mlx-lm's qwen3 does, and through the pipeline adapter
    (serving/model/pipeline_dense.py) as one stage it computes the same logits."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    from serving.model.loading import _model_classes

    model_dir = write_tiny_model(tmp_path / "q", model_type="qwen3", num_layers=4,
                                 model_cache_dir=default_cache_dir())
    reference, _ = load_model(model_dir)
    adapted, config = load_model(model_dir, get_model_classes=_model_classes)
    assert config["model_type"] == "qwen3" and type(adapted).__module__.startswith("serving.")
    adapted.model.pipeline(mx.distributed.init(), [4])
    tokens = mx.array([[1, 50, 300, 7]])
    assert mx.array_equal(reference(tokens), adapted(tokens)).item()
