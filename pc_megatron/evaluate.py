"""Held-out evaluation: mean accuracy over k samples per prompt, overall and per family."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from pc_megatron.data.dataset import PromptRow
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.rollout.base import RolloutEngine, SamplingParams
from pc_megatron.rollout.worker import encode_prompts, generate_and_score


def evaluate(
    fleet: RolloutEngine,
    tokenizer,
    rows: list[PromptRow],
    cfg: Any,
    rewards: RewardPool,
    rollout_params: SamplingParams,
    seed: int,
) -> dict[str, float]:
    """``eval_accuracy`` and ``eval_accuracy/<family>`` over ``cfg.num_prompts`` held-out rows
    (0 = all), ``cfg.samples_per_prompt`` each, at ``cfg.temperature`` (top-p 1); length and
    stop tokens as in training unless ``cfg.max_new_tokens`` is set."""
    if cfg.num_prompts:
        rows = rows[: cfg.num_prompts]
    params = dataclasses.replace(
        rollout_params,
        temperature=cfg.temperature,
        top_p=1.0,
        max_new_tokens=cfg.max_new_tokens or rollout_params.max_new_tokens,
    )
    completions, scored = generate_and_score(
        fleet, tokenizer, rewards, rows, encode_prompts(tokenizer, rows), cfg.samples_per_prompt, params, seed
    )
    by_family: dict[str, list[float]] = defaultdict(list)
    for c, res in zip(completions, scored.results, strict=True):
        by_family[str(rows[c.prompt_index].meta.get("family", "all"))].append(float(res.correct))
    acc = sum(float(r.correct) for r in scored.results) / len(scored.results)
    return {"eval_accuracy": acc, **{f"eval_accuracy/{f}": sum(v) / len(v) for f, v in sorted(by_family.items())}}
