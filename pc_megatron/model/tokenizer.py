"""Loading a policy folder's tokenizer."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: str | Path):
    # AutoTokenizer would rewrite the pre-tokenizer for Qwen2 configs; load the file as-is.
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
