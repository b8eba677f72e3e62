"""The rank program: init the group, load the model, then serve (rank 0) or mirror (workers)."""

from __future__ import annotations

import logging
import os
import sys

from contract import rank_env
from contract.exit_codes import RankExit
from contract.settings import SettingsError
from serving.distributed import DistributedEnvError, detect_env
from serving.faults import FaultPlan, FaultSpecError
from serving.rank.cli import parse_settings
from serving.rank.logs import setup_logging
from serving.rank.peer_watch import PeerWatch

log = logging.getLogger("serving.rank")


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
        env = detect_env()
    except (SettingsError, DistributedEnvError) as exc:
        print(f"serving: configuration error: {exc}", file=sys.stderr)
        return RankExit.CONFIG_ERROR
    peer_watch = PeerWatch()
    peer_watch.install()  # before logging: our handlers must write to the real stderr
    setup_logging(env.rank, os.environ.get(rank_env.LAUNCH_ID) or "dev",
                  settings.serving.log_level)
    if sys.platform == "darwin":  # Linux ranks die with their agent by PR_SET_PDEATHSIG
        from serving.rank.parent_watch import watch_agent

        watch_agent()
    try:
        faults = FaultPlan.from_env(env.rank)
    except FaultSpecError as exc:
        log.error("bad %s: %s", rank_env.FAULT, exc)
        return RankExit.CONFIG_ERROR
    if faults.active:
        log.warning("fault injection active: %s", os.environ.get(rank_env.FAULT))
    faults.on_init()
    if env.rank == 0:
        from serving.rank.rank0 import run_rank0  # binds its API before joining the group

        code = run_rank0(settings, env, faults, peer_watch)
    else:
        from serving.rank.worker import run_worker_rank

        code = run_worker_rank(settings, env, faults)
    log.info("exiting with %d", code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # MLX's backend threads must not keep a dead rank alive
