"""`python -m serving`: run one serving rank (or hold as a standby until told to run)."""

import os
import sys

from node_agent.standby import STANDBY_ENV  # deployed beside serving
from serving.standby import wait_for_go

if os.environ.get(STANDBY_ENV) and not wait_for_go():
    sys.exit(0)

from serving.rank import main

sys.exit(main())
