"""The console the commands print their tables to."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 320  # room for every column of `status` and `linktest`, with no cell cut


def report_console() -> Console:
    """A terminal's own width; output to a pipe, a file or a log gets room for every cell,
    where rich would assume 80 columns and cut them (a numeric COLUMNS still decides)."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=PIPED_WIDTH)
