"""The StepPlan: what rank 0 tells every worker about each engine step, and its broadcast.

Wire format, per plan, over `all_sum` (rank 0 contributes the data, workers zeros):
  1. a fixed 9 x int64 header: kind, step id, payload length, batch fingerprint,
     token digest, the step whose tokens that digest covers, the step's prefill
     chunk (serving/engine/prefill_pacing.py), the step's draft slots and the drafts
     rank 0 accepted in the digest's step (serving/engine/speculative.py);
  2. only when the header's payload length is > 0: the msgpack payload (inserts and
     removes) as uint8;
  3. only when the header's draft slots are > 0: the drafts, 1 + slots int64 (how many
     drafts, then the drafts), sent at the start of the step: rank 0 proposes them from
     the text the previous step produced.
So a step whose batch composition is unchanged costs one 72-byte collective.

While the batch is busy, the plan for step s+1 is queued before step s's forward pass
(see serving/engine.py): a worker receives it while step s computes and builds step
s+1's graph meanwhile, keeping mlx-lm's BatchGenerator pipelined on every rank.
"""

from __future__ import annotations

import enum

import mlx.core as mx
import msgspec
import numpy as np

from serving.distributed import PeerLost

HEADER_LEN = 9


class PlanKind(enum.IntEnum):
    STEP = 1  # run one engine step
    KEEPALIVE = 2  # idle: prove the collective path is alive, keep the link warm
    SHUTDOWN = 3  # rank 0 is stopping: workers exit 0
    PAUSE = 4  # no step follows the current one for now: wait for the next plan


class SamplingParams(msgspec.Struct, frozen=True, array_like=True):
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int  # rank 0 draws one when the client gives none, so all ranks sample alike
    # Logits processors and filters travel in the plan: every rank applies the same ones,
    # so the logits every rank samples from stay identical.
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: list[tuple[int, float]] = []  # (token id, bias), in the client's order
    forced: list[int] = []  # test aid (serving/faults.py): tokens to emit, then EOS
    # A ceiling on the reasoning (serving/engine/reasoning_budget.py); -1: none. The
    # thinking markers' tokens, and whether the prompt opened the reasoning.
    reasoning_budget: int = -1
    think_start: list[int] = []
    think_end: list[int] = []
    in_reasoning: bool = False


class Insert(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    prompt: list[int]
    params: SamplingParams


class PlanPayload(msgspec.Struct, array_like=True):
    inserts: list[Insert] = []
    removes: list[int] = []  # BatchGenerator uids, identical on every rank


class StepPlan(msgspec.Struct):
    kind: PlanKind
    step_id: int = 0
    fingerprint: int = 0  # of rank 0's batch composition right after its latest applied plan
    token_digest: int = 0  # of the tokens step `digest_step` produced
    digest_step: int = 0  # the latest step rank 0 had finished when it sent this plan
    prefill_chunk: int = 0  # prompt tokens per prefilling sequence this step; 0: the maximum
    draft_slots: int = 0  # > 0: a drafts message of this many slots follows the payload
    accepted: int = 0  # drafts rank 0 accepted in step `digest_step` (0: not speculative)
    inserts: list[Insert] = []
    removes: list[int] = []

    @property
    def changes_batch(self) -> bool:
        return bool(self.inserts or self.removes)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(PlanPayload)


def encode_payload(plan: StepPlan) -> bytes:
    if not plan.changes_batch:
        return b""
    return _encoder.encode(PlanPayload(plan.inserts, plan.removes))


def decode_payload(data: bytes) -> PlanPayload:
    return _decoder.decode(data)


class PlanChannel:
    """Broadcasts plans from rank 0 to the workers over the tensor group.

    Every collective runs on `stream`, the BatchGenerator's stream, so that it is
    ordered with the model's own all_sums and never interleaves with them.
    """

    def __init__(self, group: mx.distributed.Group, stream: mx.Stream) -> None:
        self._group = group
        self._stream = stream
        self.is_source = group.rank() == 0

        self._in_flight: list[mx.array] = []

    def _all_sum(self, values: mx.array, wait: bool = True) -> mx.array:
        out = mx.distributed.all_sum(values, group=self._group, stream=self._stream)
        if wait:
            mx.eval(out)
        else:
            mx.async_eval(out)
        return out

    def send(self, plan: StepPlan, wait: bool = True) -> None:
        """Rank 0: broadcast `plan`, header then payload.

        With wait=False the collectives are only queued on the stream, ahead of the
        step's forward pass: rank 0 knows the plan already, only workers must block.
        """
        self.send_payload(self.send_header(plan, wait), wait)

    def send_header(self, plan: StepPlan, wait: bool = False) -> bytes:
        """Rank 0: broadcast the header alone; returns the payload for send_payload().

        A worker asks for the payload as soon as it has read the header. When the header
        went out ahead of a forward pass (the worker queued its receive at the same
        point), the payload must follow that forward pass: hence a separate call."""
        payload = encode_payload(plan)
        header = [
            plan.kind, plan.step_id, len(payload), plan.fingerprint, plan.token_digest,
            plan.digest_step, plan.prefill_chunk, plan.draft_slots, plan.accepted,
        ]
        self._keep(self._all_sum(mx.array(header, dtype=mx.int64), wait))
        return payload

    def send_payload(self, payload: bytes, wait: bool = False) -> None:
        if payload:
            self._keep(self._all_sum(mx.array(np.frombuffer(payload, dtype=np.uint8)), wait))

    def _keep(self, queued: mx.array) -> None:
        """Keep queued arrays referenced until they have surely run."""
        self._in_flight = [*self._in_flight[-3:], queued]

    def synchronize(self) -> None:
        """Wait for everything queued on the stream (used to time a send alone)."""
        mx.synchronize(self._stream)

    def receive(self) -> StepPlan:
        """Workers: wait for and return rank 0's next plan."""
        return self.finish_receive(self.receive_async())

    def receive_async(self) -> mx.array:
        """Workers: queue the next header's collective; finish_receive() waits for it."""
        return self._all_sum(mx.zeros(HEADER_LEN, dtype=mx.int64), wait=False)

    def finish_receive(self, pending: mx.array) -> StepPlan:
        header = np.array(pending)
        kind, step_id, length, fingerprint, digest, digest_step, chunk, slots, accepted = (
            int(v) for v in header
        )
        if kind == 0:  # rank 0 always sends a kind: MLX failed the collective and returned zeros
            raise PeerLost("plan header without rank 0's data: the ring lost a peer")
        payload = PlanPayload()
        if length:
            data = self._all_sum(mx.zeros(length, dtype=mx.uint8))
            payload = decode_payload(np.array(data).tobytes())
        return StepPlan(
            PlanKind(kind), step_id, fingerprint, digest, digest_step, chunk, slots, accepted,
            payload.inserts, payload.removes,
        )

    def send_drafts(self, drafts: list[int], slots: int) -> None:
        """Rank 0: the drafts of a step whose header announced `slots` (queued only)."""
        message = [len(drafts), *drafts, *[0] * (slots - len(drafts))]
        self._keep(self._all_sum(mx.array(message, dtype=mx.int64), wait=False))

    def receive_drafts(self, slots: int) -> list[int]:
        """Workers: the drafts rank 0 proposed for this step (possibly none)."""
        message = np.array(self._all_sum(mx.zeros(slots + 1, dtype=mx.int64))).tolist()
        count = int(message[0])
        if not 0 <= count <= slots:
            raise PeerLost(f"drafts message without rank 0's data (count {count})")
        return [int(v) for v in message[1 : 1 + count]]
