"""Where the benchmarks write their figures: bench/results/ (not in git)."""

from __future__ import annotations

import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(name: str, suffix: str = ".json") -> Path:
    """bench/results/<name>-<timestamp><suffix>, its folder made."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}{suffix}"
