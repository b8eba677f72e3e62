"""Tensor-parallel ranks over the ring backend produce exactly the 1-rank greedy output."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.serving.rank_cluster import rank_cluster

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]


def greedy_outputs(workdir: Path, model_dir: Path, ranks: int, max_tokens: int) -> list[str]:
    """Greedy chat completions for PROMPTS from a fresh `ranks`-rank cluster."""
    with rank_cluster(workdir, model_dir, ranks, served_model_id="m") as cluster:
        outputs = []
        for prompt in PROMPTS:
            r = httpx.post(
                f"{cluster.base_url}/v1/chat/completions",
                timeout=600,
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                },
            )
            assert r.status_code == 200, r.text
            body = r.json()
            outputs.append(
                f"{body['usage']['completion_tokens']}:{body['choices'][0]['message']['content']}"
            )
        for rank in range(ranks):
            assert f"tensor shard {rank}/{ranks}" in cluster.log_text(rank)
        return outputs


def test_three_ranks_match_one_rank_on_bundled_model(
    tmp_path: Path, bundled_model_dir: Path
) -> None:
    """SmolLM2 at 3 ranks: greedy text and token counts equal the 1-rank run."""
    single = greedy_outputs(tmp_path / "r1", bundled_model_dir, 1, 16)
    assert greedy_outputs(tmp_path / "r3", bundled_model_dir, 3, 16) == single


@pytest.mark.parametrize("ranks", [2, 4])
def test_tiny_model_matches_one_rank(tmp_path: Path, tiny_model_dir: Path, ranks: int) -> None:
    """The random tiny Llama at 2 and 4 ranks: greedy output equals the 1-rank run."""
    single = greedy_outputs(tmp_path / "r1", tiny_model_dir, 1, 24)
    assert greedy_outputs(tmp_path / f"r{ranks}", tiny_model_dir, ranks, 24) == single
