"""The one shape of a preflight failure, whichever check found it.

`up` reports every failure at once (and exits 2 without launching); each names the node,
the check (a metric label too), what was found and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreflightFailure:
    node: str  # "*" when the failure is about the cluster as a whole
    check: str
    found: str
    fix: str

    def render(self) -> str:
        return f"[{self.check}] {self.node}: {self.found}\n    fix: {self.fix}"
