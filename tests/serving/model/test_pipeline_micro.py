"""The two-micro-batch pipeline prototype (serving/model/pipeline_micro.py, measured by
bench/pipeline_micro.py; not on the serving path) decodes exactly what the plain
pipelined forward decodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving.model.bundled import default_cache_dir
from serving.model.pipeline_micro import halves
from testkit import paths
from testkit.tiny_model import write_tiny_model

REPO = paths.ROOT


def test_halves_cover_the_batch_in_order() -> None:
    """Micro-batches are contiguous, as even as possible, and never empty."""
    assert halves(5, 2) == [slice(0, 3), slice(3, 5)]
    assert halves(4, 1) == [slice(0, 4)]
    assert halves(1, 2) == [slice(0, 1)]


@pytest.mark.e2e
def test_two_micro_batches_equal_the_plain_pipeline(
    tmp_path: Path, bundled_quantized_dir: Path
) -> None:
    """2 real ring ranks of a tiny random 3-layer llama (uneven split, odd and even
    batches): the staggered micro-batches and the one-micro-batch control give plain's
    greedy tokens. (The bundled SmolLM2 is the bench's default, for its figures; a step of
    it costs ~10 times the tiny model's and the schedule is the same.)
    `bundled_quantized_dir`: the tokenizer's source, converted once."""
    model = write_tiny_model(tmp_path / "tiny3", num_layers=3,
                             model_cache_dir=default_cache_dir())
    out = tmp_path / "figures.json"
    subprocess.run(
        [sys.executable, "bench/pipeline_micro.py", "--model", str(model), "--splits", "2,1",
         "--batches", "3", "4", "--steps", "12", "--reps", "1", "--out", str(out)],
        cwd=REPO, check=True, timeout=600,
    )
    summary = json.loads(out.read_text())["runs"]["2,1"]["summary"]
    assert set(summary) == {"3", "4"}
    for row in summary.values():
        assert all(row[mode]["equals_plain"] for mode in ("plain", "serial", "micro")), row
