"""`python -m serving`: run one serving rank (or hold as a standby until told to run)."""

import os
import sys

from contract.rank_env import STANDBY
from serving.blas import load_openblas
from serving.rank.idle_wake import ignore_wakes
from serving.rank.standby import wait_for_go

ignore_wakes()  # a worker listens for them once it serves
load_openblas()  # before anything imports mlx.core

if os.environ.get(STANDBY) and not wait_for_go():
    sys.exit(0)

from serving.rank.main import main  # noqa: E402 - after the BLAS is loaded

sys.exit(main())
