"""`python -m node_agent`: see node_agent/agent.py.

This file must stay importable by any Python 3 so that a wrong interpreter on
a node gets a clear message instead of a SyntaxError from deeper modules.
"""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - the node python is not ours to assume
    sys.stderr.write(
        "node_agent: needs Python 3.11 or newer; {} is Python {}.{}.{}{}.\n"
        "Fix: set [bootstrap] venv in cluster.toml and run `orchestrator bootstrap"
        " cluster.toml` (it builds this node a venv from a newer Python, python.org's or"
        " Homebrew's), or point the node's `python` at a 3.11+ interpreter with mlx,"
        " mlx-lm and msgspec.\n".format(
            sys.executable,
            *sys.version_info[:3],
            # A stock Mac's python3 is the Command Line Tools' 3.9.
            " (the Command Line Tools' Python)" if "CommandLineTools" in sys.prefix else "",
        )
    )
    sys.exit(4)

try:
    import msgspec  # noqa: F401
except ImportError:
    sys.stderr.write(
        f"node_agent: the Python at {sys.executable} has no msgspec, which the agent needs.\n"
        f"Install it on this node: {sys.executable} -m pip install msgspec psutil\n"
        "(or point the node's `python` in cluster.toml at an environment with mlx, mlx-lm\n"
        " and msgspec)\n"
    )
    sys.exit(4)

from node_agent.agent import main

sys.exit(main())
