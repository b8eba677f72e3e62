"""Distributed initialisation from the environment the orchestrator sets."""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx

from contract import rank_env


class DistributedEnvError(ValueError):
    """The distributed environment variables are incomplete or inconsistent."""


@dataclass(frozen=True)
class DistributedEnv:
    backend: str | None  # "ring", "jaccl" or None (single rank)
    rank: int


def detect_env(environ: dict[str, str] | None = None) -> DistributedEnv:
    """The backend the env asks for: ring (MLX_HOSTFILE), jaccl (MLX_JACCL_COORDINATOR), none."""
    env = os.environ if environ is None else environ
    has_ring = bool(env.get(rank_env.HOSTFILE))
    has_jaccl = bool(env.get(rank_env.JACCL_COORDINATOR))
    raw_rank = env.get(rank_env.RANK)
    if not (has_ring or has_jaccl):
        if raw_rank not in (None, "", "0"):
            raise DistributedEnvError("MLX_RANK is set but neither MLX_HOSTFILE nor "
                                      "MLX_JACCL_COORDINATOR is")
        return DistributedEnv(None, 0)
    if has_ring and has_jaccl:
        raise DistributedEnvError("both MLX_HOSTFILE (ring) and MLX_JACCL_COORDINATOR (jaccl) set")
    if raw_rank is None or not raw_rank.isdigit():
        raise DistributedEnvError(f"MLX_RANK must be a non-negative integer, got {raw_rank!r}")
    if has_jaccl and not env.get(rank_env.IBV_DEVICES):
        raise DistributedEnvError("jaccl needs MLX_IBV_DEVICES next to MLX_JACCL_COORDINATOR")
    return DistributedEnv("jaccl" if has_jaccl else "ring", int(raw_rank))


def init_group(env: DistributedEnv) -> mx.distributed.Group:
    """Join the group (blocks until every rank has connected); a 1-rank group without env."""
    if env.backend is None:
        return mx.distributed.init()
    return mx.distributed.init(backend=env.backend, strict=True)


def barrier(group: mx.distributed.Group) -> None:
    """Return once every rank has reached this point."""
    if group.size() > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


class PeerLost(RuntimeError):
    """A collective completed without a peer's contribution: that peer is gone."""


def is_peer_lost(exc: BaseException) -> bool:
    """MLX reports a vanished peer as a RuntimeError from the backend ('[ring] ...')."""
    text = str(exc)
    return isinstance(exc, PeerLost) or (
        isinstance(exc, RuntimeError) and (text.startswith("[ring]") or "[jaccl]" in text)
    )
