"""Whether `up` may serve the API without a key: never by accident beyond loopback.

`api_key_env` names the variable holding the key (the key itself is never in the file).
If that variable is unset in `up`'s shell, the gateway would serve everyone who can reach
`api.host`; beyond loopback `up` refuses unless `[api] allow_no_key = true` says so.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from orchestrator.config.issues import ConfigIssue
from orchestrator.config.spec import ClusterSpec


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: reachable from elsewhere


def unset_key_issue(spec: ClusterSpec, environ: Mapping[str, str]) -> ConfigIssue | None:
    """The refusal when the key's variable is unset and the API is reachable from elsewhere
    without `allow_no_key`; None when serving is safe or chosen."""
    api, name = spec.api, spec.api.api_key_env
    if name is None or environ.get(name) or is_loopback(api.host) or api.allow_no_key:
        return None
    return ConfigIssue(
        "api.api_key_env",
        f"${name} is not set in this shell, so `up` would serve the API at "
        f"{api.host}:{api.port} to anyone who reaches it, without a key; `up` refuses",
        f"export {name}=<a secret> before `orchestrator up`, serve on 127.0.0.1, or set "
        "[api] allow_no_key = true to serve without a key on purpose",
    )


def describe_auth(spec: ClusterSpec, environ: Mapping[str, str]) -> str:
    """How the API authenticates, as `validate` shows it."""
    name = spec.api.api_key_env
    if name is None:
        return "no API key"
    if environ.get(name):
        return f"key from ${name}"
    if is_loopback(spec.api.host) or spec.api.allow_no_key:
        return f"no API key: ${name} is unset here"
    return f"${name} is unset here: `up` refuses"
