"""Prompts as the policy sees them: the tokenizer's chat template over a row's messages (verl's
format) or over its prompt, the recipe's instruction appended to the last user message, and rows
whose prompt is longer than ``data.max_prompt_tokens`` left out (and counted).

Flat rows of the embedded task have no messages: with the defaults (``chat_template=auto``, no
instruction, no length limit) they pass through unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pc_megatron.data.dataset import PromptRow
from pc_megatron.errors import ConfigError, DataError

MODES = ("auto", "always", "never")


def render_rows(rows: list[PromptRow], tokenizer, data_cfg: Any, what: str) -> tuple[list[PromptRow], int]:
    """The rows with ``prompt`` rendered (the original in ``meta["raw_prompt"]``), and how many
    were dropped as too long. ``what`` names the rows in errors (e.g. the file)."""
    mode, instruction, limit = data_cfg.chat_template, data_cfg.instruction, data_cfg.max_prompt_tokens
    out, dropped = [], 0
    for row in rows:
        messages = row.meta.get("messages")
        if mode == "always" or (mode == "auto" and messages):
            if not getattr(tokenizer, "chat_template", None):
                raise ConfigError(
                    f"{what}: the rows are chat messages but the tokenizer has no chat template; "
                    "use a model whose tokenizer_config.json has one, or set data.chat_template=never"
                )
            messages = [dict(m) for m in (messages or [{"role": "user", "content": row.prompt}])]
            if instruction:
                last = max(i for i, m in enumerate(messages) if m["role"] == "user")
                messages[last]["content"] = f"{messages[last]['content']} {instruction}"
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = f"{row.prompt} {instruction}" if instruction else row.prompt
        if limit and len(tokenizer(text, add_special_tokens=False)["input_ids"]) > limit:
            dropped += 1
            continue
        out.append(
            dataclasses.replace(row, prompt=text, meta={**row.meta, "raw_prompt": row.prompt})
            if text != row.prompt
            else row
        )
    if not out:
        raise DataError(
            f"{what}: all {len(rows)} prompts are longer than data.max_prompt_tokens={limit} tokens; raise the limit"
        )
    return out, dropped
