"""A standby rank: do the slow start-up now, then wait for the agent's "go".

The agent starts a standby with the full environment of a future launch plus
rank_env.STANDBY=1 (see node_agent/standby.py). It imports what every rank needs
(MLX, mlx-lm with transformers, the API stack), then blocks on stdin: "go" runs the
rank as if it had just been started; EOF (the agent discarded it, or died) ends it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from contract.rank_env import STANDBY_GO

WARM_MODULES = (
    "serving.rank.main",
    "serving.rank.worker",
    "serving.rank.rank0",
    "mlx_lm.tokenizer_utils",
)
# What Litestar imports only when rank 0 builds its app (Litestar.__init__'s default
# plugins: 0.2 s on this machine, the pydantic one alone 0.15 s), each imported only where
# its library is installed, as Litestar itself does.
WARM_OPTIONAL = (
    "litestar.plugins.pydantic",
    "litestar.plugins.attrs",
)


def warm() -> None:
    """Import what a rank would import on its way to serving."""
    for name in WARM_MODULES:
        importlib.import_module(name)
    for name in WARM_OPTIONAL:
        # Litestar's MissingDependencyException is an ImportError too
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def wait_for_go() -> bool:
    """Import the rank's modules, then wait; True once the agent says go."""
    warm()
    return sys.stdin.readline().strip() == STANDBY_GO
