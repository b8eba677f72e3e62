"""Benchmark: pipeline vs tensor parallelism on the same model, side by side in one run.

A random-weight Llama of the bundled model's scale that both modes can split at 2 ranks
(8 heads / 4 KV heads, 30 layers, hidden 512: tensor parallelism needs the heads to
divide), served by our ranks at 1 rank, 2 ranks tensor and 2 ranks pipeline (15 + 15
layers), in turn, each repetition in every mode before the next. Per mode: TTFT and
decode tokens/s of one stream, aggregate tokens/s of 4 and 8 concurrent streams, and the
bytes the ranks exchange per decode step (loopback bytes during one stream / its tokens;
the HTTP stream's own bytes are a few hundred per token). Figures go to
bench/results/placement-<timestamp>.json.

    .venv/bin/python bench/placement.py --reps 2 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from bench.serving import concurrent_rate, stream_once  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402
from testkit.tiny_model import write_tiny_model  # noqa: E402

MODES = {"1 rank": None, "2r tensor": "tensor", "2r pipeline": [15, 15]}


def loopback_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    return 0


def run_mode(model: Path, workdir: Path, mode: object, args: argparse.Namespace) -> dict:
    ranks = 1 if mode is None else 2
    split = mode if isinstance(mode, list) else None
    with rank_cluster(workdir, model, ranks, served_model_id="m", pipeline_split=split) as c:
        stream_once(c.base_url, "m", 8, "warmup")
        before = loopback_bytes()
        start, arrivals = stream_once(c.base_url, "m", args.max_tokens, "single")
        wire = (loopback_bytes() - before) / max(len(arrivals), 1)
        figures = {
            "ttft_s": arrivals[0] - start,
            "decode_tok_s": (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]),
            "loopback_bytes_per_token": wire,
        }
        for n in (4, 8):
            figures[f"{n}_streams_tok_s"] = concurrent_rate(c.base_url, "m", n, args.max_tokens,
                                                            f"c{n}")
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "model", num_heads=8, num_kv_heads=4,
                                 num_layers=30, hidden_size=512)
        for rep in range(args.reps):
            for name, mode in MODES.items():
                figures = run_mode(model, Path(tmp) / f"{rep}-{len(results[name])}", mode, args)
                results[name].append(figures)
                print(name, rep, {k: round(v, 3) for k, v in figures.items()}, flush=True)
    print(f"\n{'mode':<14}" + "".join(f"{k:>26}" for k in results["1 rank"][0]))
    for name, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:<14}" + "".join(f"{v:>26.3f}" for v in medians.values()))
    out = results_path("placement")
    out.write_text(json.dumps(results, indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
