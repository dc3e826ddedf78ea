"""Held-out evaluation: mean accuracy over k samples per prompt, overall and per family."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pc_megatron.data.dataset import PromptRow
from pc_megatron.rewards import Reward, score_all
from pc_megatron.rollout.base import RolloutEngine, SamplingParams


def evaluate(
    engine: RolloutEngine,
    tokenizer,
    rows: list[PromptRow],
    cfg: Any,
    reward: Reward,
    max_new: int,
    seed: int,
    timeout_s: float | None = None,
) -> tuple[float, dict[str, float]]:
    if cfg.num_prompts:
        rows = rows[: cfg.num_prompts]
    prompts = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in rows]
    params = SamplingParams(temperature=cfg.temperature, top_p=1.0, max_new_tokens=cfg.max_new_tokens or max_new)
    completions = engine.generate(prompts, cfg.samples_per_prompt, params, seed)
    texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    owners = [rows[c.prompt_index] for c in completions]
    results = score_all(reward, texts, [r.answer for r in owners], [r.id for r in owners], timeout_s)
    by_family: dict[str, list[float]] = defaultdict(list)
    for row, res in zip(owners, results, strict=True):
        by_family[str(row.meta.get("family", "all"))].append(float(res.correct))
    acc = sum(float(r.correct) for r in results) / len(results)
    return acc, {f: sum(v) / len(v) for f, v in sorted(by_family.items())}
