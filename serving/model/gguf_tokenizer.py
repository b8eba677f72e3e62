"""Rebuild Hugging Face tokenizer files from a GGUF file's tokenizer metadata.

GGUF stores a GPT-2 style byte-level BPE tokenizer as lists (`tokenizer.ggml.tokens`,
`.merges`, `.token_type`) plus special token ids and the chat template. The `tokenizers`
library turns those into `tokenizer.json`; `tokenizer_config.json` carries the special
tokens and the chat template that mlx-lm's TokenizerWrapper and `apply_chat_template`
read through transformers' AutoTokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# llama.cpp's token types (gguf-py's TokenType): 3 is a control token such as <|im_end|>.
_CONTROL = 3
# Pre-tokenizers llama.cpp knows by these names split digits one by one before the
# GPT-2 byte-level regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM / STARCODER).
_SINGLE_DIGIT_PRE = {"smollm", "starcoder", "refact", "smaug-bpe"}
_GPT2_PRE = {"gpt-2", "default"}


class GGUFTokenizerError(Exception):
    """The GGUF tokenizer is of a kind this converter does not rebuild."""


def write_tokenizer_files(metadata: dict[str, Any], dest: Path, *, context_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and
    generation_config.json into `dest`."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFTokenizerError(f"tokenizer model {model!r} is not supported (only gpt2 BPE)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    token_types = [int(t) for t in metadata["tokenizer.ggml.token_type"].tolist()]
    specials = [tok for tok, kind in zip(tokens, token_types, strict=True) if kind == _CONTROL]
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    _build_tokenizer(tokens, list(metadata["tokenizer.ggml.merges"]), specials, pre).save(
        str(dest / "tokenizer.json")
    )

    def special(key: str) -> str | None:
        value = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else tokens[int(value.item())]

    special_map = {
        "bos_token": special("bos"),
        "eos_token": special("eos"),
        "pad_token": special("padding"),
        "unk_token": special("unknown"),
    }
    special_map = {k: v for k, v in special_map.items() if v is not None}
    named = set(special_map.values())
    extra = [tok for tok in specials if tok not in named]
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    tokenizer_config: dict[str, Any] = {
        # The generic fast class loads tokenizer.json as written, pre-tokenizer included.
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "additional_special_tokens": extra,
        "add_bos_token": bool(add_bos.item()) if add_bos is not None else False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    if template := metadata.get("tokenizer.chat_template"):
        tokenizer_config["chat_template"] = str(template)
    _write_json(dest / "tokenizer_config.json", tokenizer_config)
    _write_json(
        dest / "special_tokens_map.json",
        {**special_map, "additional_special_tokens": extra},
    )
    generation = {
        key: int(metadata[f"tokenizer.ggml.{name}_token_id"].item())
        for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"))
        if f"tokenizer.ggml.{name}_token_id" in metadata
    }
    _write_json(dest / "generation_config.json", generation)


def _build_tokenizer(tokens: list[str], merges: list[str], specials: list[str], pre: str) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` equivalent to llama.cpp's for `pre`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if pre not in _SINGLE_DIGIT_PRE | _GPT2_PRE:
        raise GGUFTokenizerError(f"GGUF pre-tokenizer {pre!r} is not supported")
    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _SINGLE_DIGIT_PRE:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in specials]
    )
    return tokenizer


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
