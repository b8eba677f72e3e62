"""Ranks 1+: receive each StepPlan from rank 0, check it, apply it, step with rank 0."""

from __future__ import annotations

import logging
import signal
import threading

from contract.exit_codes import RankExit
from contract.settings import RankSettings
from serving.distributed import DistributedEnv
from serving.engine.batch import MirroredBatch, TokenEvent, digest_ints
from serving.engine.speculative import NotSpeculating, verify
from serving.engine.step_plan import PlanChannel, PlanKind, StepPlan
from serving.faults import FaultPlan
from serving.rank.idle_wake import IdleSleep
from serving.rank.startup import exit_for, join_group, load_and_sync, make_batch

log = logging.getLogger(__name__)
# An idle worker queues its next receive this long before rank 0's next keepalive is due:
# MLX's ring busy-polls from then until rank 0 joins, so the margin is what idling costs
# (a 90% share of keepalive_s slept polled 50 ms of every 500: 10% of a core per idle
# worker, measured; this margin: 1%). Arriving late only moves the poll to rank 0.
IDLE_POLL_MARGIN_S = 0.005


class Desync(Exception):
    """This worker's view of the batch differs from rank 0's."""


def check_plan(
    plan: StepPlan, expected_step: int, fingerprint: int, digests: dict[int, int],
    accepted: dict[int, int] | None = None,
) -> None:
    """Raise Desync when the plan's step id, batch fingerprint, accepted drafts or token
    digest differs from ours. `fingerprint` is our batch right after our latest applied
    plan; `digests` and `accepted` hold ours by step."""
    if plan.step_id != expected_step:
        raise Desync(f"step id rank0={plan.step_id} local={expected_step}")
    if plan.fingerprint != fingerprint:
        raise Desync(
            f"fingerprint after step {expected_step - 1}'s plan "
            f"rank0={plan.fingerprint:016x} local={fingerprint:016x}"
        )
    ours = (accepted or {}).get(plan.digest_step, 0)
    if ours != plan.accepted:
        raise Desync(
            f"accepted drafts in step {plan.digest_step} rank0={plan.accepted} local={ours}"
        )
    local = digests.get(plan.digest_step)
    if local != plan.token_digest:
        shown = "none" if local is None else f"{local:016x}"
        raise Desync(
            f"token digest of step {plan.digest_step} rank0={plan.token_digest:016x} "
            f"local={shown}"
        )


def run_worker_rank(settings: RankSettings, env: DistributedEnv, faults: FaultPlan) -> int:
    """A worker from start to exit: join, load, then mirror rank 0's plans."""
    try:
        group = join_group(env)
        loaded = load_and_sync(settings, group, faults)
        batch = make_batch(settings, loaded, group)
        channel = PlanChannel(group, batch.stream)
        return run_worker(batch, channel, faults, settings.serving.keepalive_s)
    except Exception as exc:
        return exit_for(exc)


def run_worker(
    batch: MirroredBatch, channel: PlanChannel, faults: FaultPlan, keepalive_s: float
) -> RankExit:
    """Mirror rank 0 until it sends SHUTDOWN (OK) or something is out of step (DESYNC).

    The next plan's receive is queued before each step's forward pass, in the order
    rank 0 queues its send, so this rank builds step s+1 while step s computes.
    MLX's ring backend busy-polls while a collective waits, so after a keepalive the
    worker sleeps until just before the next one is due before queueing its receive; a request on
    its way to rank 0 ends that sleep (serving/rank/idle_wake.py).
    """
    stop = threading.Event()
    # Signal handlers only record: the loop sees it at the next plan (keepalives are frequent).
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    idle = IdleSleep()
    step, fingerprint = 0, batch.fingerprint()
    digests, accepted = {0: 0}, {0: 0}  # token digest, accepted drafts by step: the latest two
    pending = channel.receive_async()
    while True:
        plan = channel.finish_receive(pending)
        if plan.kind == PlanKind.SHUTDOWN:
            log.info("shutdown plan received after %d steps", step)
            return RankExit.OK
        if stop.is_set():
            log.info("SIGTERM received: leaving")
            return RankExit.OK
        if plan.kind == PlanKind.KEEPALIVE:
            idle.sleep(max(0.0, keepalive_s - IDLE_POLL_MARGIN_S))
        if plan.kind != PlanKind.STEP:
            pending = channel.receive_async()
            continue
        step += 1
        drafts = channel.receive_drafts(plan.draft_slots) if plan.draft_slots else []
        try:
            check_plan(plan, step, fingerprint, digests, accepted)
            faults.on_step(step)
            faults.on_insert([ins.prompt for ins in plan.inserts])
            batch.apply(plan.inserts, plan.removes)
            fingerprint = batch.fingerprint(perturb=faults.desync_at(step))
            pending = channel.receive_async()
            events, kept = worker_step(batch, plan, drafts, faults.misaccept_at(step))
        except Desync as exc:
            log.error("BATCH DESYNC at step %d: %s", step, exc)
            return RankExit.DESYNC
        digests = {step - 1: digests[step - 1], step: digest_ints(
            [v for e in events for v in (e.uid, e.token)]
        )}
        accepted = {step - 1: accepted[step - 1], step: kept}


def worker_step(
    batch: MirroredBatch, plan: StepPlan, drafts: list[int], misaccept: bool
) -> tuple[list[TokenEvent], int]:
    """Run one step as rank 0 runs it: verify its drafts, or a normal batch step.
    Returns the tokens and how many drafts this rank accepted."""
    if not drafts:
        return batch.step(plan.prefill_chunk), 0
    try:
        verified = verify(batch, drafts, misaccept)
    except NotSpeculating as exc:
        raise Desync(str(exc)) from exc
    return verified.events, verified.accepted
