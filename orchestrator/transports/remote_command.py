"""The shell commands we send over SSH, built so no config value can execute.

    cd '<code dir>' && exec '<python>' -m node_agent --grace 5 --socket S    the agent
    cd '<code dir>' && exec '<python>' -m node_agent.channel.bridge S        to a running agent
    env 'K=V' '<program>' 'arg' ...                                          a command (bootstrap)

Every value is a separate word quoted with shlex.quote; a python value of
`python3; touch /tmp/x` is looked up as one (nonexistent) command name.
A leading `~/` in python expands to the remote $HOME (quoted as "$HOME").
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def remote_python_word(python: str) -> str:
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def agent_command(code_dir: str, python: str, grace_s: float, socket: str | None = None) -> str:
    options = ["--socket", socket] if socket else []
    args = shlex.join(["-m", "node_agent", "--grace", f"{grace_s:g}", *options])
    return f"cd {shlex.quote(code_dir)} && exec {remote_python_word(python)} {args}"


def bridge_command(code_dir: str, python: str, socket: str) -> str:
    """`python -m node_agent.channel.bridge SOCKET`: stdio to a running agent
    (node_agent/channel/bridge.py)."""
    args = shlex.join(["-m", "node_agent.channel.bridge", socket])
    return f"cd {shlex.quote(code_dir)} && exec {remote_python_word(python)} {args}"


def command_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    words = [remote_python_word(argv[0]), *(shlex.quote(a) for a in argv[1:])]
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    return " ".join(words)
