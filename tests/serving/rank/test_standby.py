"""A standby rank's warm-up: what rank 0 imports once told to go, it has imported already."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit.paths import ROOT

# Rank 0 builds its API app after "go": every module Litestar imports for it then (its
# default plugins, pydantic's and attrs' among them) is start-up a restart pays again.
PROBE = """
import json, sys
from serving.rank.standby import warm
warm()
before = set(sys.modules)
from contract.settings import ModelSettings, RankSettings
from serving.api.app import create_app
from serving.api.state import ServingState
from serving.metrics import ServingMetrics
create_app(ServingState(RankSettings(model=ModelSettings(path="m")), "m", 1, ServingMetrics()))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
HEAVY = ("pydantic", "litestar.plugins", "attr", "transformers", "mlx_lm", "uvicorn")


def test_rank_0s_app_imports_no_heavy_module_after_the_warm_up() -> None:
    """After warm(), building rank 0's app imports nothing of pydantic, Litestar's plugins,
    attrs, transformers, mlx-lm or uvicorn."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    late = [m for m in json.loads(out) if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert not late, f"imported only after the standby's go: {late}"
