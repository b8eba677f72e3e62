"""Where a running cluster's gateway is, and whether it serves: what `bench` asks first."""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

from orchestrator.config import ClusterSpec
from orchestrator.state_file import orchestrator_alive, read_state, state_path


@dataclass(frozen=True)
class Gateway:
    url: str  # http://host:port, no /v1
    headers: dict[str, str]  # the API key, when the cluster wants one


@dataclass(frozen=True)
class NotReady:
    state: str  # not_running | starting | restarting | failed | ... (what /health said)
    reason: str  # a sentence for the operator, with what to do


def ready_gateway(spec: ClusterSpec, timeout_s: float = 5.0) -> Gateway | NotReady:
    """The gateway of this cluster's running orchestrator if its /health says ready; else
    why not (found through the state file, as `status` finds it)."""
    name = spec.cluster.name
    state = read_state(state_path(spec))
    if state is None or not orchestrator_alive(state):
        return NotReady("not_running", f"{name} is not running: start it with `orchestrator up`")
    url = state.api_url.removesuffix("/").removesuffix("/v1")
    key = os.environ.get(state.api_key_env) if state.api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        health = httpx.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return NotReady("starting", f"{name}'s gateway at {url} does not answer yet ({exc}); "
                        "wait until `orchestrator status` says READY")
    if health.status_code != 200:
        body = _json(health)
        gang = str(body.get("status", "unknown"))
        why = str(body.get("reason", "")) or f"/health answered {health.status_code}"
        return NotReady(gang, f"{name} is {gang} ({why}); bench measures a ready cluster: "
                        "wait until `orchestrator status` says READY")
    # The variable unset in `up`'s shell means no key: only the gateway knows. Ask it.
    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return NotReady("unknown", f"{name}'s gateway at {url} stopped answering ({exc})")
    if models.status_code == 401:
        where = f"${state.api_key_env}" if state.api_key_env else "the key's variable"
        return NotReady("unknown", f"{name} wants its API key: set {where} in this shell")
    return Gateway(url, headers)


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
