"""Pipeline-parallel ranks (each a range of layers, mlx-lm's PipelineMixin; llama and dense
qwen3 through serving/model/pipeline_dense.py) produce exactly the 1-rank output: greedy, a seeded
sample through every logits processor with logprobs, and a second turn from the prefix
cache."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import httpx
import pytest

from serving.model.bundled import default_cache_dir
from testkit.rank_cluster import rank_cluster
from testkit.serving_requests import PROCESSED  # every logits processor at once
from testkit.tiny_model import write_tiny_model
from testkit.waiting import metric_value

pytestmark = pytest.mark.e2e

PROMPT = "Write a haiku about the sea."
# Tokens per answer: each a decode step through both stages (SmolLM2: ~0.25 s of CPU).
MAX_TOKENS = 6


def chat(url: str, messages: list[dict[str, str]], **fields: object) -> dict[str, object]:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=600,
        json={"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, **fields},
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    logprobs = choice.get("logprobs") or {}
    return {
        "text": choice["message"]["content"],
        "logprobs": [_rounded(t["logprob"]) for t in logprobs.get("content") or []],
    }


def outputs(workdir: Path, model_dir: Path, split: list[int] | None,
            resident: list[int] | None = None) -> list[dict[str, object]]:
    """The answers; each rank's peak resident memory once loaded is added to `resident`."""
    ranks = len(split) if split else 1
    with rank_cluster(workdir, model_dir, ranks, served_model_id="m",
                      pipeline_split=split) as cluster:
        if resident is not None:
            resident.extend(_peak_resident(p.pid) for p in cluster.procs)
        url = cluster.base_url
        first = chat(url, [{"role": "user", "content": PROMPT}], temperature=0)
        sampled = chat(url, [{"role": "user", "content": PROMPT}], **PROCESSED)
        reused = metric_value(url, "serving_prefix_cache_hit_tokens_total")
        turns = [{"role": "user", "content": PROMPT},
                 {"role": "assistant", "content": str(first["text"])},
                 {"role": "user", "content": "Another one, about the moon."}]
        second = chat(url, turns, temperature=0)
        assert metric_value(url, "serving_prefix_cache_hit_tokens_total") - reused >= 20
        if split:
            for rank, (start, end) in enumerate(_ranges(split)):
                log = cluster.log_text(rank)
                assert f"pipeline stage with layers [{start}, {end}) {rank}/{ranks}" in log
                assert "DESYNC" not in log
        return [first, sampled, second]


def _ranges(split: list[int]) -> list[tuple[int, int]]:
    return [(sum(split[r + 1 :]), sum(split[r:])) for r in range(len(split))]


def test_two_rank_pipeline_matches_one_rank(tmp_path: Path, bundled_model_dir: Path) -> None:
    """SmolLM2 (a llama: 9 heads, which 2 ranks cannot split by heads) at 2 pipeline
    ranks with an uneven split (rank 0 the last 20 layers, rank 1 the first 10), as ranks
    here serve it (float32 on OpenBLAS; the 4-bit form in pipeline: test_hub_up)."""
    whole: list[int] = []
    staged: list[int] = []
    single = outputs(tmp_path / "r1", bundled_model_dir, None, whole)
    assert outputs(tmp_path / "p2", bundled_model_dir, [20, 10], staged) == single
    # Each stage read only its layers: a rank's peak resident memory is below the whole
    # model's by at least half the bytes of the layers it leaves out (rank 0: 10 of 30;
    # rank 1: 20).
    layer = _layer_bytes(bundled_model_dir)
    print(f"peak resident once loaded: whole model {whole[0] / 1e6:.0f} MB, stages "
          f"{[round(r / 1e6) for r in staged]} MB; a layer {layer / 1e6:.1f} MB")
    for rank, left_out in enumerate((10, 20)):
        assert whole[0] - staged[rank] >= 0.5 * left_out * layer, (rank, whole, staged, layer)


def _peak_resident(pid: int) -> int:
    """The process's peak resident memory (Linux's VmHWM): a rank that read every layer and
    dropped the others afterwards peaks as high as the whole model's."""
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(peak.split()[1]) * 1024  # "VmHWM:   123456 kB"


def _layer_bytes(model_dir: Path) -> float:
    """One decoder layer's weight bytes, from the safetensors headers (no weight read)."""
    total, layers = 0, set()
    for file in model_dir.glob("*.safetensors"):
        with file.open("rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        for name, entry in header.items():
            if ".layers." in name:
                layers.add(name.split(".layers.")[1].split(".")[0])
                total += entry["data_offsets"][1] - entry["data_offsets"][0]
    return total / len(layers)


def test_qwen3_pipeline_matches_one_rank(tmp_path: Path, bundled_quantized_dir: Path) -> None:
    """A tiny random dense qwen3 (q/k norms in attention; mlx-lm has no pipeline for it)
    in float32 at 2 pipeline ranks, rank 0 the last 3 of 4 layers. `bundled_quantized_dir`:
    the tokenizer's source, converted once."""
    model = write_tiny_model(tmp_path / "qwen3", model_type="qwen3", num_layers=4,
                             model_cache_dir=default_cache_dir())
    single = outputs(tmp_path / "r1", model, None)
    assert single[0]["text"]
    assert outputs(tmp_path / "p2", model, [3, 1]) == single


def _rounded(logprob: float | None) -> float | None:
    return None if logprob is None else round(logprob, 3)  # None: -inf (a banned token)
