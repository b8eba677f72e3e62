"""`python -m serving`: run one serving rank."""

import sys

from serving.rank import main

sys.exit(main())
