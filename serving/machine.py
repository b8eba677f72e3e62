"""How many ranks of this launch share this rank's machine (one kernel): they split its
cores (serving/blas.py) and its memory (the prefix cache's default bound). Standard
library only: serving/blas.py runs before MLX is imported."""

from __future__ import annotations

import json
import os
from pathlib import Path

from contract.rank_env import HOSTFILE, RANK, RANKS_ON_MACHINE


def ranks_on_machine() -> int:
    """As the launch plan counted them from the nodes' boot_ids; a rank started without it
    (by hand, or by the test harness) counts the ranks behind its own address."""
    planned = os.environ.get(RANKS_ON_MACHINE, "")
    if planned.isdigit():
        return max(1, int(planned))
    try:
        hosts = json.loads(Path(os.environ[HOSTFILE]).read_text(encoding="utf-8"))
        mine = hosts[int(os.environ[RANK])][0].rsplit(":", 1)[0]
        return max(1, sum(entry[0].rsplit(":", 1)[0] == mine for entry in hosts))
    except (KeyError, OSError, ValueError, IndexError, TypeError):
        return 1
