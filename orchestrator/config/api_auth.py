"""Whether `up` may serve the API without a key: never by accident beyond loopback.

`api_key_env` names the variable holding the key (the key itself is never in the file).
If it is left out, or its variable is unset in `up`'s shell, the gateway would serve
everyone who can reach `api.host`; beyond loopback `up` refuses unless
`[api] allow_no_key = true` says so.
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
    """The refusal when there is no key (api_key_env left out or its variable unset) and the
    API is reachable from elsewhere without `allow_no_key`; None when safe or chosen."""
    api, name = spec.api, spec.api.api_key_env
    if (name and environ.get(name)) or is_loopback(api.host) or api.allow_no_key:
        return None
    if name is None:
        return ConfigIssue(
            "api.api_key_env",
            f"is not set, so `up` would serve the API at {api.host}:{api.port} to anyone "
            "who reaches it, without a key; `up` refuses",
            'set api_key_env = "ORCHESTRATOR_API_KEY" under [api] and export that variable '
            "before `orchestrator up`, serve on 127.0.0.1, or set [api] allow_no_key = true "
            "to serve without a key on purpose",
        )
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
        return "no API key" if _keyless_chosen(spec) else "no api_key_env: `up` refuses"
    if environ.get(name):
        return f"key from ${name}"
    if _keyless_chosen(spec):
        return f"no API key: ${name} is unset here"
    return f"${name} is unset here: `up` refuses"


def _keyless_chosen(spec: ClusterSpec) -> bool:
    """Serving without a key is fine: on loopback, or chosen with allow_no_key."""
    return is_loopback(spec.api.host) or spec.api.allow_no_key
