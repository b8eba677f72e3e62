"""Which gang launches next: a previous run's gang to adopt, the standby ranks started
while the current gang served, or a new launch; and when the standbys start.

Standby ranks start once the gang has been ready STANDBY_AFTER_S and rank 0 has no
request, so their start-up (seconds of CPU per node) does not slow the first requests;
under constant load they start anyway after STANDBY_BUSY_AFTER_S. Every launch made here
is remembered: its ranks (and their holds on the RDMA devices) are ours.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.launch.gang import Gang
from orchestrator.supervision.progress import ServingSample

STANDBY_AFTER_S = 3.0
STANDBY_BUSY_AFTER_S = 60.0


def standby_due(sample: ServingSample | None, ready_for_s: float) -> bool:
    """Whether the standbys start now, the gang ready for ready_for_s with rank 0's
    latest counters `sample` (None: unknown, as busy)."""
    idle = sample is not None and sample.running == 0 and sample.waiting == 0
    return (idle and ready_for_s >= STANDBY_AFTER_S) or ready_for_s >= STANDBY_BUSY_AFTER_S


class NextGang:
    def __init__(self, new_gang: Callable[[], Gang], standby_ranks: bool) -> None:
        self._new_gang, self._standby_ranks = new_gang, standby_ranks
        self.launch_ids: set[str] = set()  # every launch of this run: its ranks are ours
        self._standby: Gang | None = None  # the next launch, its ranks started as standbys
        self._adopted: Gang | None = None  # a previous run's gang, to serve on first

    def adopt(self, gang: Gang) -> None:  # serve this running gang first: no pre-launch checks
        self._adopted = gang

    @property
    def adopting(self) -> bool:
        """The next launch is an adopted gang: it holds its ports and devices already."""
        return self._adopted is not None

    def take(self) -> Gang:
        """The gang to launch now: the adopted one, else the standby, else a new one."""
        gang = self._adopted or self._standby or self._new_gang()
        self._standby = self._adopted = None
        self.launch_ids.add(gang.launch_id)
        return gang

    def drop_standby(self) -> None:
        """Forget the standby (its ranks end with the rest of ours): the next is new."""
        self._standby = None

    async def start_standby_when_due(
        self, sample: ServingSample | None, ready_for_s: float
    ) -> None:
        """Start the next launch's ranks as standbys, once per gang, when due (see above)."""
        if not self._standby_ranks or self._standby is not None:
            return
        if standby_due(sample, ready_for_s):
            self._standby = self._new_gang()
            self.launch_ids.add(self._standby.launch_id)
            await self._standby.start_standby()
