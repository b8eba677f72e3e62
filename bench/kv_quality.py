"""Benchmark: what a quantized KV cache costs in quality ([serving] kv_bits 8 and 4 vs none).

Through the real serving path: a rank started with `kv_bits`, and OpenAI completions with
`logprobs` from its API.

- Perplexity of the bundled model over the GPL-3 text Debian ships
  (/usr/share/common-licenses/GPL-3), teacher-forced: the rank runs with the forced-output
  test aid (rank_env.FORCED_OUTPUT), whose sampler emits the text's tokens one by one while
  the logprobs reported are the model's own for each of them, so every position is read
  back through the (quantized) cache as a decode step. The prompt is the text's title
  line; the first `--prefill` tokens of the rest go in the prompt too when given, so a
  long prompt read in chunks is measured as well.
- Greedy agreement on fixed chat prompts: how many leading tokens match unquantized.

Targets (issue 41): perplexity <= +1% at 8 bits, <= +5% at 4.

    .venv/bin/python bench/kv_quality.py [--tokens 2000] [--ranks 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import RESULTS, results_path  # noqa: E402

from contract.blas import find_openblas  # noqa: E402
from contract.rank_env import FORCED_OUTPUT  # noqa: E402
from contract.settings import ModelSettings, RankSettings  # noqa: E402
from serving.model.loading import resolve  # noqa: E402
from testkit.kv_quality import forced_perplexity, greedy_tokens, text_tokens  # noqa: E402
from testkit.rank_cluster import rank_cluster  # noqa: E402

GPL = Path("/usr/share/common-licenses/GPL-3")
PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a lighthouse.",
    "List three uses of a paperclip.",
    "What is 12 times 7? Explain the steps.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
]
# (kv_bits, kv_group_size, kv_window): the default window (64), and 4 / 64 without one
CONFIGS = ((None, 64, 0), (8, 64, 64), (4, 64, 64), (4, 32, 64), (4, 64, 0))
TARGETS = {8: 0.01, 4: 0.05}


def measure(model_dir: Path, ranks: int, config: tuple[int | None, int, int], text: str,
            args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One configuration: a forced cluster for perplexity, a plain one for greedy."""
    serving: dict[str, Any] = {"max_tokens_limit": 16384, "prompt_cache_size": 0}
    bits, group, window = config
    if bits:
        serving.update(kv_bits=bits, kv_group_size=group, kv_window=window)
    split = [15, 15] if ranks == 2 else None  # SmolLM2's 3 KV heads: pipeline at 2
    tag = f"{ranks}r-{bits or 16}-{group}-{window}"
    with rank_cluster(work / f"ppl-{tag}", model_dir, ranks, pipeline_split=split,
                      served_model_id="m", env={FORCED_OUTPUT: text}, **serving) as cluster, \
            httpx.Client(base_url=cluster.base_url, timeout=3600) as client:
        tic = time.perf_counter()
        nll = forced_perplexity(client, args.title, args.tokens + 8)
        ppl_s = time.perf_counter() - tic
    with rank_cluster(work / f"greedy-{tag}", model_dir, ranks, pipeline_split=split,
                      served_model_id="m", **serving) as cluster, \
            httpx.Client(base_url=cluster.base_url, timeout=600) as client:
        greedy = [greedy_tokens(client, p, args.max_tokens)[0] for p in PROMPTS]
    return {"ranks": ranks, "kv_bits": bits, "kv_group_size": group, "kv_window": window,
            "tokens": len(nll),
            "perplexity": math.exp(sum(nll) / len(nll)), "perplexity_s": round(ppl_s, 1),
            "greedy": greedy}


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """Leading tokens equal to the reference's, per prompt, and how many match whole."""
    leading = []
    for got, want in zip(tokens, reference, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                 min(len(got), len(want)))
        leading.append(n)
    return {"leading_equal": leading, "identical": sum(
        a == b for a, b in zip(tokens, reference, strict=True)), "prompts": len(reference)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2000, help="text tokens scored")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1])
    parser.add_argument("--max-tokens", type=int, default=48, help="greedy answer length")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    args = parser.parse_args()
    model_dir = resolve(RankSettings(model=ModelSettings(path=args.model)),
                        float32=find_openblas() is not None)
    args.title, text = text_tokens(model_dir, GPL.read_text(), args.tokens)
    work = RESULTS / f"kv-quality-work-{int(time.time())}"
    rows = [measure(model_dir, ranks, config, text, args, work)
            for ranks in args.ranks for config in CONFIGS]
    greedy = [row.pop("greedy") for row in rows]
    for row, tokens in zip(rows, greedy, strict=True):
        i = next(i for i, r in enumerate(rows)
                 if r["ranks"] == row["ranks"] and r["kv_bits"] is None)
        base = rows[i]
        row["perplexity_delta"] = row["perplexity"] / base["perplexity"] - 1
        row["target"] = TARGETS.get(row["kv_bits"] or 0)
        row["greedy_agreement"] = agreement(tokens, greedy[i])
        print(f"{row['ranks']} rank(s) kv_bits {row['kv_bits'] or '-':>2} group "
              f"{row['kv_group_size']} window {row['kv_window']}: perplexity "
              f"{row['perplexity']:.4f} ({row['perplexity_delta']:+.2%}, target "
              f"{row['target'] if row['target'] is not None else '-'}) over {row['tokens']} "
              f"tokens in {row['perplexity_s']} s; greedy identical "
              f"{row['greedy_agreement']['identical']}/{len(PROMPTS)}, leading equal "
              f"{row['greedy_agreement']['leading_equal']}")
    out = results_path("kv-quality")
    out.write_text(json.dumps({"text": str(GPL), "tokens": args.tokens, "rows": rows},
                              indent=2))
    print(f"figures: {out}")


if __name__ == "__main__":
    main()
