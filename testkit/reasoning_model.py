"""A tiny model whose tokenizer has real reasoning markers, built offline: the tiny model
(testkit/tiny_model.py) with `<think>`/`</think>` added as tokens (as Qwen3's tokenizer has
them), so mlx-lm's tokenizer wrapper finds them (`has_thinking`), and a Qwen3-style chat
template that reads `enable_thinking` and earlier turns' `reasoning_content`."""

from __future__ import annotations

import json
from pathlib import Path

from testkit.tiny_model import write_tiny_model

THINK_TOKENS = ("<think>", "</think>")
TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
    "\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{%- endif -%}"
)


def write_reasoning_model(dest: Path, markers: tuple[str, ...] = THINK_TOKENS) -> Path:
    """The tiny model in `dest`, its tokenizer given `markers` as added tokens (ids after
    the vocabulary; the embeddings grow to match) and TEMPLATE as its chat template."""
    model = write_tiny_model(dest, vocab_size=49152 + 64)
    tokenizer_path = model / "tokenizer.json"
    tokenizer = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    first = 1 + max(t["id"] for t in tokenizer["added_tokens"])
    first = max(first, len(tokenizer["model"]["vocab"]))
    for offset, content in enumerate(markers):
        token = {"id": first + offset, "content": content, "single_word": False,
                 "lstrip": False, "rstrip": False, "normalized": False, "special": False}
        tokenizer["added_tokens"].append(token)
        config.setdefault("added_tokens_decoder", {})[str(first + offset)] = {
            k: v for k, v in token.items() if k != "id"}
    config["chat_template"] = TEMPLATE
    tokenizer_path.write_text(json.dumps(tokenizer), encoding="utf-8")
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return model
