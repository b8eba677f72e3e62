"""How many sequences of a given length fit a given KV budget, as admission counts them.

    .venv/bin/python bench/kv_fit.py [--budget-gb 1 4 16] [--prompt 1500] [--max-tokens 512]

For the bundled model (as the ranks here serve it: float32 activations with OpenBLAS)
and published configs in tests/fixtures/model_configs/, at 1 and 2 ranks (tensor, or
pipeline halves where the KV heads do not divide), unquantized and with kv_bits 8 and 4
(groups of 64): the sequences of `--prompt` + `--max-tokens` tokens that rank 0 admits
together under each budget (contract/kv_cache.py's batch_kv_bytes: mlx-lm pads a batch
to its longest sequence, in steps of 256 tokens). tests/contract/test_kv_cache.py checks
that arithmetic against real mlx-lm caches (16-bit, float32 and 4-bit);
tests/serving/engine/test_kv_admission.py sees a real rank admit that many.
Writes bench/results/kv_fit-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_file import results_path  # noqa: E402

from contract.fingerprint import ModelConfigInfo  # noqa: E402
from contract.kv_cache import allocated_tokens, rank_layouts, sequence_kv_bytes  # noqa: E402
from contract.model_config import config_info  # noqa: E402
from testkit.model_configs import CONFIGS, SMOLLM2  # noqa: E402

MODELS = ("Qwen3-235B-A22B", "gpt-oss-120b", "Llama-3.3-70B-Instruct", "Qwen3-30B-A3B")


def fitting(config: ModelConfigInfo, ranks: int, bits: int | None, tokens: int,
            budget: int, element_bytes: int | None = None) -> int:
    """Tensor mode where the KV heads divide by `ranks`, else pipeline in equal halves; the
    tightest rank decides."""
    layers = config.num_hidden_layers or 0
    split = None
    if (config.num_key_value_heads or 1) % ranks:
        split = [layers // ranks + (r < layers % ranks) for r in range(ranks)]
    layouts = rank_layouts(config, ranks, split, kv_bits=bits, kv_group_size=64,
                           element_bytes=element_bytes)
    return min(budget // sequence_kv_bytes(config, layout, allocated_tokens(tokens))
               for layout in layouts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gb", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    parser.add_argument("--prompt", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    tokens = args.prompt + args.max_tokens
    models = {"bundled smollm2 (float32)": (config_info(SMOLLM2), 4)}
    models |= {name: (config_info(json.loads((CONFIGS / f"{name}.json").read_text())), None)
               for name in MODELS}
    rows = []
    print(f"sequences of {args.prompt} + {args.max_tokens} tokens that fit a KV budget "
          "per rank: 16-bit (or float32) / 8-bit / 4-bit")
    for name, (config, element) in models.items():
        for ranks in (1, 2):
            for gb in args.budget_gb:
                counts = [fitting(config, ranks, bits, tokens, int(gb * 1e9), element)
                          for bits in (None, 8, 4)]
                rows.append({"model": name, "ranks": ranks, "budget_gb": gb,
                             "fit": dict(zip(("none", "8", "4"), counts, strict=True))})
                print(f"{name:28} {ranks} rank{'s' if ranks > 1 else ' '} {gb:6.1f} GB: "
                      + " / ".join(map(str, counts)))
    out = results_path("kv_fit")
    out.write_text(json.dumps({"tokens": tokens, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
