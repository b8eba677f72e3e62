"""Benchmark: what our per-step coordination costs, and the token-sync A/B.

Runs N real ranks over the ring backend (started directly: MLX_RANK + MLX_HOSTFILE) on
one model, decodes the same fixed batch in five modes, interleaved round by round so
machine noise hits every mode alike, and reports the time per decode step:

  model             the forward pass alone: every rank knows the schedule, nothing else
                    is sent (the floor; not a protocol, a reference)
  lockstep          rank 0 queues step s's StepPlan header (one 56-byte all_sum) just
                    before step s; workers wait for it, check it (step id, batch
                    fingerprint, token digest), then build step s; every rank samples
                    itself with the request's seed
  pipelined         what serving does: the header for step s+1 is queued before step s's
                    forward pass, so workers receive it while step s computes
  tokens            the issue's other design: the lockstep header, and rank 0 samples
                    alone and broadcasts the token ids (one more all_sum per step, in
                    the step's own graph)
  tokens-pipelined  the token broadcast with the pipelined header

Figures go to bench/results/step-comm-<timestamp>-<ranks>r.json and a table is printed.

    .venv/bin/python bench/step_comm.py --ranks 3 --batch 1 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results_file import RESULTS, results_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = ("model", "lockstep", "pipelined", "tokens", "tokens-pipelined")
PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def run_rank(args: argparse.Namespace) -> None:
    """One rank: load, then decode rounds x modes; rank 0 writes the figures."""
    from contract.settings import ModelSettings, RankSettings
    from serving.distributed import detect_env, init_group
    from serving.model.loading import load

    group = init_group(detect_env())
    loaded = load(RankSettings(model=ModelSettings(path=args.model)), group)
    bench = RankBench(args, group, loaded)
    figures = {str(size): bench.rounds(size) for size in args.batch}
    if group.rank() == 0:
        Path(args.out).write_text(json.dumps(
            {"ranks": group.size(), "model": args.model, "steps": args.steps,
             "rounds": args.rounds, "seconds_per_step": figures}, indent=2))


class RankBench:
    """One rank's side of the benchmark: the same decode loop in every mode."""

    def __init__(self, args: argparse.Namespace, group: Any, loaded: Any) -> None:
        self.args, self.group, self.loaded = args, group, loaded
        self.rank = group.rank()
        self.prompt = list(loaded.tokenizer.encode(PROMPT))

    def rounds(self, batch_size: int) -> dict[str, list[float]]:
        """Seconds per step of every mode, one figure per round, modes rotated per round."""
        self.decode("pipelined", batch_size)  # warm-up: compile, allocate
        per_mode: dict[str, list[float]] = {mode: [] for mode in MODES}
        for round_no in range(self.args.rounds):
            shift = round_no % len(MODES)  # rotate the order: no mode always runs first
            outputs = set()
            for mode in MODES[shift:] + MODES[:shift]:
                seconds, output = self.decode(mode, batch_size)
                per_mode[mode].append(seconds)
                outputs.add(output)
            if len(outputs) != 1:
                raise SystemExit(f"rank {self.rank}: the modes decoded different tokens")
            if self.rank == 0:
                print(f"batch {batch_size} round {round_no}: " + ", ".join(
                    f"{m} {per_mode[m][-1] * 1000:.1f} ms" for m in MODES), flush=True)
        return per_mode

    def broadcast_sampler(self, logprobs: Any) -> Any:
        """Rank 0 samples; the others contribute zeros to the all_sum. Their zeros are
        computed from their own logits: a constant would let MLX run this all_sum before
        the forward pass's, pairing it with another rank's different collective."""
        import mlx.core as mx
        from mlx_lm.sample_utils import greedy_sampler

        tokens = greedy_sampler(logprobs)
        if self.rank != 0:
            tokens = tokens * 0
        return mx.distributed.all_sum(tokens, group=self.group)

    def _full_batch(self, mode: str, batch_size: int) -> Any:
        """A batch of `batch_size` copies of the prompt, prefilled until all decode."""
        from mlx_lm.sample_utils import greedy_sampler

        from serving.engine.batch import MirroredBatch

        batch = MirroredBatch(self.loaded.model, set(), self.loaded.vocab_size, batch_size, 2048)
        tokens_mode = mode.startswith("tokens") and self.group.size() > 1
        sampler: Callable[[Any], Any] = self.broadcast_sampler if tokens_mode else greedy_sampler
        uids = batch.generator.insert(
            [self.prompt] * batch_size,
            max_tokens=[self.args.steps + 64] * batch_size,
            samplers=[sampler] * batch_size,
        )
        batch.active.update(dict.fromkeys(uids))
        while len(batch.step()) < batch_size:
            pass
        return batch

    def decode(self, mode: str, batch_size: int) -> tuple[float, int]:
        """Seconds per decode step over args.steps steps of a full batch, and a digest of
        every step's tokens (equal in every mode, or a mode is broken)."""
        import mlx.core as mx

        from serving.distributed import barrier
        from serving.engine.batch import digest_ints
        from serving.engine.step_plan import PlanChannel

        batch = self._full_batch(mode, batch_size)
        channel = PlanChannel(self.group, batch.stream)
        barrier(self.group)
        header = "none" if mode == "model" or self.group.size() == 1 else (
            "pipelined" if mode.endswith("pipelined") else "lockstep"
        )
        started = time.perf_counter()
        digests = self._steps(batch, channel, header)
        mx.synchronize(batch.stream)
        elapsed = (time.perf_counter() - started) / self.args.steps
        batch.close()
        barrier(self.group)
        return elapsed, digest_ints([digests[step] for step in range(1, self.args.steps + 1)])

    def _steps(self, batch: Any, channel: Any, header: str) -> dict[int, int]:
        """Decode args.steps steps, with plan headers sent the way `header` says."""
        from serving.engine.batch import digest_ints
        from serving.engine.step_plan import PlanKind, StepPlan
        from serving.rank.worker import check_plan

        fingerprint, digests = batch.fingerprint(), {0: 0}

        def plan(step: int, done: int) -> StepPlan:
            """The plan for `step`, sent when step `done` is the latest finished."""
            return StepPlan(PlanKind.STEP, step, fingerprint, digests[done], done)

        source = self.rank == 0
        if header == "pipelined":  # plan 1 goes first; then plan s+1 before step s
            if source:
                channel.send(StepPlan(PlanKind.STEP, 1, fingerprint), wait=False)
            else:
                pending = channel.receive_async()
        for step in range(1, self.args.steps + 1):
            if header == "lockstep":
                if source:
                    channel.send(plan(step, step - 1), wait=False)
                else:
                    check_plan(channel.receive(), step, fingerprint, digests)
            elif header == "pipelined":
                if source:
                    channel.send(plan(step + 1, step - 1), wait=False)
                else:
                    check_plan(channel.finish_receive(pending), step, fingerprint, digests)
                    pending = channel.receive_async()
            events = batch.step()
            digests[step] = digest_ints([v for e in events for v in (e.uid, e.token)])
        return digests


PAIRS = (("lockstep", "pipelined"), ("lockstep", "tokens"), ("pipelined", "tokens-pipelined"))


def summarize(out: Path) -> None:
    data = json.loads(out.read_text())
    print(f"\n{data['ranks']} ranks, {data['steps']} decode steps x {data['rounds']} rounds, "
          "ms per step min / median / max")
    for batch_size, per_mode in data["seconds_per_step"].items():
        medians = {m: statistics.median(v) for m, v in per_mode.items()}
        for mode, values in per_mode.items():
            ms = sorted(v * 1000 for v in values)
            extra = (medians[mode] - medians["model"]) / medians[mode] * 100
            print(f"  batch {batch_size:>2} {mode:<16} {ms[0]:8.1f} {statistics.median(ms):8.1f} "
                  f"{ms[-1]:8.1f}   over model: {extra:+5.1f} % of the step")
        # Modes of one round ran back to back: their differences cancel most machine noise.
        for base, other in PAIRS:
            diffs = [(b - a) * 1000 for a, b in zip(per_mode[base], per_mode[other], strict=True)]
            faster = sum(d < 0 for d in diffs)
            print(f"  batch {batch_size:>2} {other} vs {base}: median "
                  f"{statistics.median(diffs):+.2f} ms per step, faster in {faster}/{len(diffs)}"
                  " rounds")


def launch(args: argparse.Namespace) -> int:
    from testkit.ports import free_ports

    out = results_path(f"step-comm-{args.ranks}r")
    hostfile = RESULTS / f"step-comm-hostfile-{os.getpid()}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(args.ranks)]))
    argv = [sys.executable, __file__, "--rank-process", "--out", str(out), "--model", args.model,
            "--steps", str(args.steps), "--rounds", str(args.rounds),
            "--batch", *map(str, args.batch)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    procs = [
        subprocess.Popen(argv, env={**env, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
                         start_new_session=True)
        for r in range(args.ranks)
    ]
    try:
        codes = [proc.wait() for proc in procs]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        hostfile.unlink(missing_ok=True)
    if any(codes):
        print(f"rank exit codes: {codes}", file=sys.stderr)
        return 1
    summarize(out)
    print(f"\nwritten: {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="")
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_process:
        run_rank(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
