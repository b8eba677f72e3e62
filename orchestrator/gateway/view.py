"""What the gateway needs from the control plane, and nothing more."""

from __future__ import annotations

from typing import Protocol

from orchestrator.supervision.failures import RankFailure
from orchestrator.supervision.snapshot import Upstream
from orchestrator.supervision.state import GangState


class ClusterView(Protocol):
    @property
    def state(self) -> GangState: ...

    @property
    def reason(self) -> str: ...

    @property
    def draining(self) -> bool:
        """True once shutdown began: no request will get a gang any more."""
        ...

    def wake_workers(self) -> None:
        """A request is about to reach rank 0: have the idle workers listen now."""
        ...

    async def wait_for_upstream(self, timeout_s: float, not_launch: str = "") -> Upstream | None:
        """Rank 0 of a ready gang (other than `not_launch`), or None if none within the timeout."""
        ...

    async def failure_of(self, launch_id: str, timeout_s: float) -> RankFailure | None:
        """The first failure the supervisor saw of launch `launch_id`, waiting up to the
        timeout for it; None if none was seen."""
        ...
