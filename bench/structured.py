"""Benchmark: a JSON-schema-constrained request's decode speed against an unconstrained
one, side by side on the same ranks.

Our ranks are started once per layout (1 rank; `--ranks 2`: a 2-rank pipeline of the
bundled model), and each repetition streams the same greedy prompt twice, once plain
and once with `response_format` json_schema (a long string field, `minLength` so both
answers run to max_tokens or close), the order alternating. Per request: TTFT and decode
tokens/s ((completion tokens - 1) / first-to-last chunk); per layout the median ratio
constrained / plain of the pairs, and its range. Goal (issue 39): >= 0.8.
Figures go to bench/results/structured-<timestamp>.json and a table is printed.

    .venv/bin/python bench/structured.py [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from orchestrator.loadgen.streams import chat_body, stream_chat  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402

PROMPT = ("Write a long story about a lighthouse keeper and a storm, as JSON with the "
          "title in `title` and the story in `story`.")
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "story": {"type": "string", "minLength": 2000},
    },
    "required": ["title", "story"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA,
                                                 "strict": True}}
KINDS = ("plain", "constrained")


@dataclass
class Figures:
    ranks: int
    kind: str
    ttft_s: list[float] = field(default_factory=list)
    tok_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def one_stream(url: str, kind: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT, decode tokens/s, completion tokens) of one greedy streamed chat."""
    body = chat_body("m", PROMPT, max_tokens, usage=True)
    if kind == "constrained":
        body["response_format"] = FORMAT
    with httpx.Client(timeout=1800) as client:
        times = stream_chat(client, url, body)
    if times.error or not times.arrivals:
        raise RuntimeError(f"stream failed: {times.error or 'no content'}")
    span = times.arrivals[-1] - times.arrivals[0]
    rate = (times.tokens - 1) / span if span > 0 else float("nan")
    return times.arrivals[0] - times.started, rate, times.tokens


def bench_ranks(model_dir: Path, ranks: int, args: argparse.Namespace) -> list[Figures]:
    layers = int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])
    split = None if ranks == 1 else [layers // ranks + (r < layers % ranks) for r in range(ranks)]
    figures = {kind: Figures(ranks, kind) for kind in KINDS}
    with rank_cluster(args.workdir / f"r{ranks}", model_dir, ranks, served_model_id="m",
                      pipeline_split=split) as cluster:
        for kind in KINDS:  # warm-up: the first constrained insert builds the grammar tokenizer
            one_stream(cluster.base_url, kind, 8)
        for rep in range(args.repeats):
            for kind in KINDS if rep % 2 == 0 else KINDS[::-1]:
                ttft, rate, tokens = one_stream(cluster.base_url, kind, args.max_tokens)
                fig = figures[kind]
                fig.ttft_s.append(ttft)
                fig.tok_s.append(rate)
                fig.tokens.append(tokens)
                print(f"  {ranks}r {kind} #{rep}: ttft {ttft:.2f} s, {rate:.2f} tok/s, "
                      f"{tokens} tokens", flush=True)
    return list(figures.values())


def ratios(figures: list[Figures], ranks: int) -> list[float]:
    by_kind = {f.kind: f.tok_s for f in figures if f.ranks == ranks}
    return [c / p for c, p in zip(by_kind["constrained"], by_kind["plain"], strict=True)]


def print_table(figures: list[Figures], rank_counts: list[int]) -> None:
    print(f"\n{'ranks':>5} {'kind':12} {'TTFT s':>7} {'tok/s':>7} {'tokens':>7}")
    for f in figures:
        print(f"{f.ranks:>5} {f.kind:12} {statistics.median(f.ttft_s):>7.2f} "
              f"{statistics.median(f.tok_s):>7.2f} {statistics.median(f.tokens):>7.0f}")
    for ranks in rank_counts:
        r = ratios(figures, ranks)
        print(f"{ranks} rank(s): constrained / plain decode = {statistics.median(r):.2f} "
              f"(range {min(r):.2f}-{max(r):.2f}, {len(r)} pairs; goal >= 0.8)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/structured-bench"))
    args = parser.parse_args()
    model_dir = resolve(RankSettings(model=ModelSettings(path=args.model)),
                        float32=find_openblas() is not None)  # as the ranks serve it
    figures: list[Figures] = []
    for ranks in args.ranks:
        figures.extend(bench_ranks(model_dir, ranks, args))
    print_table(figures, args.ranks)
    out = results_path("structured")
    meta = {"model": args.model, "max_tokens": args.max_tokens, "repeats": args.repeats,
            "cpu_count": os.cpu_count(),
            "ratios": {str(r): ratios(figures, r) for r in args.ranks}}
    out.write_text(json.dumps({"meta": meta, "figures": [asdict(f) for f in figures]},
                              indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
