"""Ranks 1+: receive each StepPlan from rank 0, check it, apply it, step with rank 0."""

from __future__ import annotations

import logging
import signal
import threading
import time

from serving.batch import MirroredBatch, digest_ints
from serving.exit_codes import RankExit
from serving.faults import FaultPlan
from serving.step_plan import PlanChannel, PlanKind, StepPlan

log = logging.getLogger("serving.worker")
IDLE_SLEEP_SHARE = 0.9  # of the keepalive interval, spent asleep rather than polling


class Desync(Exception):
    """This worker's view of the batch differs from rank 0's."""


def check_plan(plan: StepPlan, expected_step: int, local_digest: int) -> None:
    """Raise Desync when the plan's step id or previous-token digest differs from ours."""
    if plan.step_id != expected_step:
        raise Desync(f"step id: rank0={plan.step_id} local={expected_step}")
    if plan.token_digest != local_digest:
        raise Desync(f"token digest: rank0={plan.token_digest:016x} local={local_digest:016x}")


def run_worker(
    batch: MirroredBatch, channel: PlanChannel, faults: FaultPlan, keepalive_s: float
) -> RankExit:
    """Mirror rank 0 until it sends SHUTDOWN (OK) or something is out of step (DESYNC).

    MLX's ring backend busy-polls while a collective waits, so after a keepalive the
    worker sleeps most of the interval instead of spinning until rank 0's next plan.
    """
    stop = threading.Event()
    # Signal handlers only record: the loop sees it at the next plan (keepalives are frequent).
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    step, digest = 0, 0
    while True:
        plan = channel.receive()
        if plan.kind == PlanKind.SHUTDOWN:
            log.info("shutdown plan received after %d steps", step)
            return RankExit.OK
        if stop.is_set():
            log.info("SIGTERM received: leaving")
            return RankExit.OK
        if plan.kind == PlanKind.KEEPALIVE:
            time.sleep(keepalive_s * IDLE_SLEEP_SHARE)
            continue
        step += 1
        try:
            check_plan(plan, step, digest)
        except Desync as exc:
            log.error("BATCH DESYNC at step %d: %s", step, exc)
            return RankExit.DESYNC
        faults.on_step(step)
        batch.apply(plan.inserts, plan.removes)
        local = batch.fingerprint(perturb=faults.desync_at(step))
        if local != plan.fingerprint:
            log.error(
                "BATCH DESYNC at step %d: fingerprint rank0=%016x local=%016x",
                step, plan.fingerprint, local,
            )
            return RankExit.DESYNC
        events = batch.step()
        digest = digest_ints([v for e in events for v in (e.uid, e.token)])
