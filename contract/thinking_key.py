"""The cluster's thinking key: what rank 0 signs its thinking blocks with.

A client may send an answer's thinking back in a later turn (Anthropic's Messages API);
rank 0 accepts it only with a signature it made (serving/api/thinking_signature.py). The
key belongs to the cluster, not to a launch: the head draws it once, keeps it 0600 in its
state dir (orchestrator/launch/thinking_key.py) and gives it to every launch's rank 0 as
FILE in its working directory, so a signature made before a restart or a failover still
checks. A rank 0 without the file (started by hand, tests) draws a key of its own.
"""

from __future__ import annotations

FILE = "thinking_key"  # in rank 0's working directory
