"""The one shell command we send over SSH, built so no config value can execute.

    cd '<code dir>' && exec '<python>' -m node_agent --grace 5

Every value is a separate word quoted with shlex.quote; a python value of
`python3; touch /tmp/x` is looked up as one (nonexistent) command name.
A leading `~/` in python expands to the remote $HOME (quoted as "$HOME").
"""

from __future__ import annotations

import shlex


def remote_python_word(python: str) -> str:
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def agent_command(code_dir: str, python: str, grace_s: float) -> str:
    args = shlex.join(["-m", "node_agent", "--grace", f"{grace_s:g}"])
    return f"cd {shlex.quote(code_dir)} && exec {remote_python_word(python)} {args}"
