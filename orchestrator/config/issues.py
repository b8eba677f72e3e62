"""A problem found in cluster.toml, with its field path and fix, and the error listing all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    message: str
    fix: str = ""
    severity: Literal["error", "warning"] = "error"

    def render(self, file: Path) -> str:
        where = f"{file}: {self.path}" if self.path else str(file)
        return f"{where}: {self.message}" + (f"\n    fix: {self.fix}" if self.fix else "")


class ConfigErrors(Exception):
    """Every error found in one config file."""

    def __init__(self, file: Path, issues: list[ConfigIssue]) -> None:
        self.file = file
        self.issues = issues
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.issues)
        head = f"{self.file}: {count} error{'s' if count != 1 else ''}"
        return "\n".join([head, *("  " + issue.render(self.file) for issue in self.issues)])
