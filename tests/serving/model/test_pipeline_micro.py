"""The two-micro-batch pipeline prototype (serving/model/pipeline_micro.py, measured by
bench/pipeline_micro.py; not on the serving path) decodes exactly what the plain
pipelined forward decodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving.model.pipeline_micro import halves
from testkit import paths

REPO = paths.ROOT


def test_halves_cover_the_batch_in_order() -> None:
    """Micro-batches are contiguous, as even as possible, and never empty."""
    assert halves(5, 2) == [slice(0, 3), slice(3, 5)]
    assert halves(4, 1) == [slice(0, 4)]
    assert halves(1, 2) == [slice(0, 1)]


@pytest.mark.e2e
def test_two_micro_batches_equal_the_plain_pipeline(tmp_path: Path) -> None:
    """2 real ring ranks of the bundled SmolLM2 (uneven split, odd and even batches): the
    staggered micro-batches and the one-micro-batch control give plain's greedy tokens."""
    out = tmp_path / "figures.json"
    subprocess.run(
        [sys.executable, "bench/pipeline_micro.py", "--splits", "20,10", "--batches", "3", "4",
         "--steps", "12", "--reps", "1", "--out", str(out)],
        cwd=REPO, check=True, timeout=600,
    )
    summary = json.loads(out.read_text())["runs"]["20,10"]["summary"]
    assert set(summary) == {"3", "4"}
    for row in summary.values():
        assert all(row[mode]["equals_plain"] for mode in ("plain", "serial", "micro")), row
