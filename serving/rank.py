"""The rank program: init the group, load the model, then serve (rank 0) or mirror (workers)."""

from __future__ import annotations

import logging
import os
import sys

import mlx.core as mx

from serving.batch import MirroredBatch
from serving.cli import parse_settings
from serving.distributed import (
    DistributedEnv,
    DistributedEnvError,
    barrier,
    detect_env,
    init_group,
    is_peer_lost,
)
from serving.exit_codes import RankExit
from serving.faults import FaultPlan, FaultSpecError
from serving.loading import LoadedModel, ModelLoadError, load
from serving.logs import setup_logging
from serving.peer_watch import PeerWatch
from serving.settings import RankSettings, SettingsError
from serving.step_plan import PlanChannel

log = logging.getLogger("serving.rank")


def make_batch(settings: RankSettings, loaded: LoadedModel) -> MirroredBatch:
    return MirroredBatch(
        loaded.model,
        set(loaded.tokenizer.eos_token_ids),
        loaded.vocab_size,
        settings.max_batch_size,
        settings.prefill_step_size,
        settings.prompt_cache_size,
    )


def load_and_sync(
    settings: RankSettings, group: mx.distributed.Group, faults: FaultPlan
) -> LoadedModel:
    faults.on_load()
    loaded = load(settings, group)
    barrier(group)
    log.info("all %d ranks loaded", group.size())
    return loaded


def join_group(env: DistributedEnv) -> mx.distributed.Group:
    """Init the backend (blocks until every rank has connected)."""
    try:
        group = init_group(env)
    except Exception as exc:
        raise DistributedInitError(f"distributed init ({env.backend}) failed: {exc}") from exc
    log.info("rank %d of %d (backend %s) pid %d", group.rank(), group.size(),
             env.backend or "single", os.getpid())
    return group


class DistributedInitError(Exception):
    """mx.distributed.init failed."""


def run_worker_rank(settings: RankSettings, env: DistributedEnv, faults: FaultPlan) -> int:
    from serving.worker import run_worker

    try:
        group = join_group(env)
        loaded = load_and_sync(settings, group, faults)
        batch = make_batch(settings, loaded)
        return run_worker(batch, PlanChannel(group, batch.stream), faults, settings.keepalive_s)
    except Exception as exc:
        return exit_for(exc)


def exit_for(exc: BaseException) -> RankExit:
    """Log a rank's fatal failure and pick its exit code."""
    if isinstance(exc, DistributedInitError):
        log.error("%s", exc)
        return RankExit.DISTRIBUTED_INIT_FAILED
    if isinstance(exc, ModelLoadError):
        log.error("%s", exc)
        return RankExit.MODEL_LOAD_FAILED
    if is_peer_lost(exc):
        log.error("peer lost: %s", exc)
        return RankExit.PEER_LOST
    log.exception("internal error", exc_info=exc)
    return RankExit.INTERNAL_ERROR


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
        env = detect_env()
    except (SettingsError, DistributedEnvError) as exc:
        print(f"serving: configuration error: {exc}", file=sys.stderr)
        return RankExit.CONFIG_ERROR
    launch_id = settings.launch_id or os.environ.get("MLX_LAUNCH_ID") or "dev"
    peer_watch = PeerWatch()
    peer_watch.install()  # before logging: our handlers must write to the real stderr
    setup_logging(env.rank, launch_id, settings.log_level)
    if sys.platform == "darwin":  # Linux ranks die with their agent by PR_SET_PDEATHSIG
        from node_agent.parent_watch import watch_agent  # deployed beside serving

        watch_agent()
    try:
        faults = FaultPlan.from_env(env.rank)
    except FaultSpecError as exc:
        log.error("bad ORCHESTRATOR_FAULT: %s", exc)
        return RankExit.CONFIG_ERROR
    if faults.active:
        log.warning("fault injection active: %s", os.environ.get("ORCHESTRATOR_FAULT"))
    faults.on_init()
    if env.rank == 0:
        from serving.server import run_rank0  # binds its API before joining the group

        code = run_rank0(settings, env, faults, peer_watch)
    else:
        code = run_worker_rank(settings, env, faults)
    log.info("exiting with %d", code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MLX's backend threads must not keep a dead rank alive
