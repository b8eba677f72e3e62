"""Benchmark: the quantized KV cache's speed and memory ([serving] kv_bits 4 and 8 vs none).

Per rank count (2: a pipeline, SmolLM2's 3 KV heads do not split in 2) and kv_bits, on a
fresh cluster of the bundled model, through rank 0's API, in this order:

1. memory: 8 concurrent streamed chats of ~1,500-token prompts (distinct slices of the
   GPL-3 text: no prefix shared) and 16 tokens each; each rank's peak resident memory
   (VmHWM) after it loaded and after the load, and the difference (mostly KV);
2. short context: decode tokens/s of one 64-token answer to a short prompt;
3. long context: one ~8,000-token prompt: prefill tokens/s (prompt tokens / time to first
   token) and decode tokens/s at that context.

Target (issue 41): decode at 8,000 tokens of context >= 0.9x unquantized. Also printed:
the KV bytes per token by configuration, how many full-context (8,192-token) sequences
fit in 1 GB of KV, and how many of the memory phase's sequences (1,500 + 16 tokens) fit
`--budget-gb`: as admission counts them (bench/kv_fit.py's arithmetic, float32 as served
here) and from the measured peak RSS growth per sequence. Figures to
bench/results/kv-cache-<timestamp>.json, rewritten after each configuration (a run cut
short keeps what it measured).

    .venv/bin/python bench/kv_cache.py [--ranks 1 2] [--long-tokens 7900]
        [--short-tokens 64] [--short-repeats 2] [--long-decode 48] [--budget-gb 1]
        [--bits none 8 4] [--skip-memory | --memory-only] [--prefill-step 512]

The memory phase also polls rank 0's /metrics (kv_memory_poll.py): the KV bytes admission
holds per rank and MLX's active and peak memory, their maxima and samples in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.blas import find_openblas  # noqa: E402
from contract.model_config import config_info  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import StreamTimes, chat_body, concurrent_streams  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.rank_cluster import RankCluster, rank_cluster  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from kv_fit import fitting  # noqa: E402
from kv_memory_poll import ACTIVE, PEAK, Poller, read  # noqa: E402
from results_file import RESULTS, results_path  # noqa: E402

GPL = Path("/usr/share/common-licenses/GPL-3")
CONTEXT = 8192  # SmolLM2's


def peak_rss(cluster: RankCluster) -> list[int]:
    """Each rank's peak resident set size (VmHWM) so far, in bytes."""
    peaks = []
    for proc in cluster.procs:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        peaks.append(int(line.split()[1]) * 1024)
    return peaks


def decode_tps(times: StreamTimes) -> float:
    if times.error or len(times.arrivals) < 2:
        raise RuntimeError(times.error or "too few tokens")
    return (len(times.arrivals) - 1) / (times.arrivals[-1] - times.arrivals[0])


def slices(text: str, tokenizer: Any, count: int, tokens: int) -> list[str]:
    """`count` distinct passages of about `tokens` tokens each (wrapping around)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    stride = max(1, (len(ids) - tokens) // max(count - 1, 1))
    out = []
    for i in range(count):
        start = (i * stride) % max(len(ids) - tokens, 1)
        out.append(tokenizer.decode(ids[start : start + tokens]))
    return out


def run_one(model_dir: Path, ranks: int, bits: int | None, prompts: dict[str, Any],
            work: Path, args: argparse.Namespace) -> dict[str, Any]:
    # An ~8,000-token prompt read on a shared 2-core machine outlasts the default
    # request_timeout_s (600 s): a run on 2026-11-28 timed out there.
    serving: dict[str, Any] = {"max_batch_size": 8, "prompt_cache_size": 0,
                               "max_tokens_limit": 8192, "request_timeout_s": 3600.0,
                               "prefill_step_size": args.prefill_step}
    if bits:
        serving["kv_bits"] = bits
    split = [15, 15] if ranks == 2 else None
    row: dict[str, Any] = {"ranks": ranks, "kv_bits": bits, "prefill_step": args.prefill_step}
    with rank_cluster(work / f"{ranks}r-{bits or 16}-{args.prefill_step}", model_dir, ranks,
                      served_model_id="m",
                      pipeline_split=split, **serving) as cluster:
        url = cluster.base_url
        if args.skip_memory:
            return _long_prompt(url, row, prompts, args)
        _eight_prompts(cluster, row, prompts)
        if args.memory_only:
            return row
        with httpx.Client(timeout=3600) as client:
            short = [concurrent_streams(url, [chat_body("m", prompts["short"],
                                                        args.short_tokens)],
                                        client=client)[0][0]
                     for _ in range(args.short_repeats)]
            row["decode_tps_short"] = statistics.median(decode_tps(s) for s in short)
            progress(f"{ranks}r kv_bits {bits}: short decode {row['decode_tps_short']:.1f}")
            _long_prompt(url, row, prompts, args, client)
    return row


def _eight_prompts(cluster: RankCluster, row: dict[str, Any], prompts: dict[str, Any]) -> None:
    """The memory phase: 8 concurrent ~1,500-token prompts; peak RSS before and after, and
    /metrics polled meanwhile (kv_memory_poll.py): admission's KV bytes per rank at their
    peak, rank 0's MLX active memory at its peak and MLX's peak (prefill included)."""
    url = cluster.base_url
    loaded = peak_rss(cluster)
    with httpx.Client(timeout=30) as client:
        idle = read(url, client)
    bodies = [chat_body("m", p + "\nSummarize this.", 16) for p in prompts["eight"]]
    with Poller(url) as poll:
        streams, wall = concurrent_streams(url, bodies)
    if any(s.error for s in streams):
        raise RuntimeError([s.error for s in streams if s.error])
    with httpx.Client(timeout=30) as client:
        done = read(url, client)
    after = peak_rss(cluster)
    row.update(peak_rss_loaded=loaded, peak_rss_under_load=after,
               peak_rss_growth=[b - a for a, b in zip(loaded, after, strict=True)],
               eight_prompts_wall_s=round(wall, 2),
               kv_bytes_max={k: v for k, v in poll.maxima.items() if k.startswith("serving_kv")},
               mlx_active_loaded=idle.get(ACTIVE), mlx_peak_loaded=idle.get(PEAK),
               mlx_active_max=poll.maxima.get(ACTIVE), mlx_peak_after=done.get(PEAK),
               mlx_samples=poll.samples)
    mib = {k: round((v or 0) / 2**20) for k, v in row.items() if k.startswith("mlx_")
           and not k.endswith("samples")}
    kv = [round(v / 2**20) for v in row["kv_bytes_max"].values()]
    progress(f"{row['ranks']}r kv_bits {row['kv_bits']} prefill_step {row['prefill_step']}: "
             f"8 prompts in {wall:.0f} s; KV bytes max {kv} MiB; MLX (MiB) {mib}")


def _long_prompt(url: str, row: dict[str, Any], prompts: dict[str, Any],
                 args: argparse.Namespace, client: httpx.Client | None = None
                 ) -> dict[str, Any]:
    """The long prompt's prefill and decode, into `row` (alone: --skip-memory)."""
    (long,), _ = concurrent_streams(url, [chat_body("m", prompts["long"], args.long_decode,
                                                    usage=True)], client=client)
    if long.error or long.ttft_s is None:
        raise RuntimeError(long.error)
    row.update(long_prompt_tokens=long.prompt_tokens,
               prefill_tps=(long.prompt_tokens or 0) / long.ttft_s,
               decode_tps_long=decode_tps(long), long_ttft_s=round(long.ttft_s, 2))
    progress(f"{row['ranks']}r kv_bits {row['kv_bits']}: {long.prompt_tokens} tokens read in "
             f"{long.ttft_s:.0f} s, then {row['decode_tps_long']:.2f} tok/s")
    return row


def _long_ratios(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        base = next(x for x in rows if x["ranks"] == row["ranks"] and x["kv_bits"] is None)
        row["decode_tps_long_ratio"] = row["decode_tps_long"] / base["decode_tps_long"]
        print(row)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def kv_bytes_per_token(config: dict[str, Any], bits: int | None, group: int = 64) -> float:
    """KV bytes per token over all layers: 16-bit, or packed plus a 16-bit scale and bias
    per group (as a Mac serves it; float32 here doubles the unquantized figure)."""
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_value = 2.0 if bits is None else bits / 8 + 4 / group
    return 2 * config["num_hidden_layers"] * heads * dim * per_value


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--long-tokens", type=int, default=7900)
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--short-tokens", type=int, default=64)
    parser.add_argument("--short-repeats", type=int, default=2)
    parser.add_argument("--long-decode", type=int, default=48)
    parser.add_argument("--budget-gb", type=float, default=1.0)
    parser.add_argument("--bits", nargs="+", default=["none", "8", "4"],
                        help="kv_bits configurations (none: unquantized)")
    parser.add_argument("--skip-memory", action="store_true",
                        help="only the long prompt (prefill and decode at its context)")
    parser.add_argument("--memory-only", action="store_true",
                        help="only the 8 concurrent prompts (memory, /metrics polled)")
    parser.add_argument("--prefill-step", type=int, default=512,
                        help="[serving] prefill_step_size (tokens per prefill chunk)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    model_dir = resolve(RankSettings(model=ModelSettings(path=args.model)),
                        float32=find_openblas() is not None)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text = GPL.read_text()
    prompts = {"eight": slices(text, tokenizer, 8, 1500),
               "short": "Write a long story about a lighthouse keeper and a storm.",
               "long": slices(text * 2, tokenizer, 1, args.long_tokens)[0]
               + "\nSummarize this."}
    work = RESULTS / f"kv-cache-work-{os.getpid()}"
    out = results_path("kv-cache")
    meta = {"argv": sys.argv, "cpus": os.cpu_count(), "started": time.strftime("%F %T")}
    rows: list[dict[str, Any]] = []
    for r in args.ranks:
        for b in [None if x == "none" else int(x) for x in args.bits]:
            rows.append(run_one(model_dir, r, b, prompts, work, args))
            out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    if args.memory_only:
        return
    if args.skip_memory:
        _long_ratios(rows)
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    config = json.loads((model_dir / "config.json").read_text())
    info = config_info(config)
    budget = int(args.budget_gb * 1e9)
    for row in rows:
        base = next(x for x in rows if x["ranks"] == row["ranks"] and x["kv_bits"] is None)
        for key in ("decode_tps_short", "decode_tps_long", "prefill_tps"):
            row[key + "_ratio"] = row[key] / base[key]
        row["kv_growth_ratio"] = max(base["peak_rss_growth"]) / max(
            max(row["peak_rss_growth"]), 1)
        per_token = kv_bytes_per_token(config, row["kv_bits"])
        row["kv_bytes_per_token_16bit_mac"] = per_token
        row["full_context_sequences_per_gb"] = int(1e9 // (per_token * CONTEXT))
        row["fit_budget_gb"] = args.budget_gb
        row["fit_admission_1500_16"] = fitting(info, row["ranks"], row["kv_bits"], 1516,
                                               budget, element_bytes=4)
        per_seq = max(row["peak_rss_growth"]) / 8
        row["fit_measured_1500_16"] = int(budget // per_seq) if per_seq > 0 else None
        print(f"{row['ranks']} rank(s) kv_bits {row['kv_bits'] or '-':>2}: decode short "
              f"{row['decode_tps_short']:.1f} tok/s (x{row['decode_tps_short_ratio']:.2f}), "
              f"at {row['long_prompt_tokens']} tokens {row['decode_tps_long']:.1f} tok/s "
              f"(x{row['decode_tps_long_ratio']:.2f}), prefill {row['prefill_tps']:.0f} "
              f"tok/s (x{row['prefill_tps_ratio']:.2f}); peak RSS under 8x1500 "
              f"{[round(x / 2**20) for x in row['peak_rss_under_load']]} MiB, growth "
              f"{[round(x / 2**20) for x in row['peak_rss_growth']]} MiB; "
              f"{row['full_context_sequences_per_gb']} full-context sequences per GB; "
              f"1500+16 in {args.budget_gb} GB: {row['fit_admission_1500_16']} (admission), "
              f"{row['fit_measured_1500_16']} (measured growth)")
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
