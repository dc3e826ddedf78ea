"""Turn completions (or prompt + answer rows) into the learner's right-padded token batch, and measure
what came back."""

from __future__ import annotations

import torch

from pc_megatron.data.dataset import PromptRow
from pc_megatron.learner.learner import TokenBatch
from pc_megatron.rollout.base import Completion


def completions_to_batch(
    prompts: list[list[int]], completions: list[Completion], pad_id: int
) -> tuple[TokenBatch, torch.Tensor]:
    """Return the batch (``loss_mask`` on the generated tokens) and the engine's sampling
    log-probs aligned with it, ``(N, S-1) float32`` (0 where the mask is 0)."""
    seqs = [prompts[c.prompt_index] + c.token_ids for c in completions]
    width = max(map(len, seqs))
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    engine_logp = torch.zeros((len(seqs), width - 1))
    for i, (seq, c) in enumerate(zip(seqs, completions, strict=True)):
        start = len(prompts[c.prompt_index]) - 1
        tokens[i, : len(seq)] = torch.tensor(seq)
        mask[i, start : start + len(c.token_ids)] = 1.0
        engine_logp[i, start : start + len(c.token_ids)] = torch.tensor(c.logprobs)
    return TokenBatch(tokens, mask), engine_logp


def sft_batch(tokenizer, rows: list[PromptRow]) -> TokenBatch:
    """``prompt + answer + EOS``, loss on the answer and EOS only."""
    seqs, starts = [], []
    for r in rows:
        p = tokenizer(r.prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(r.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        starts.append(len(p))
    width = max(map(len, seqs))
    tokens = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    for i, (s, start) in enumerate(zip(seqs, starts, strict=True)):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, start - 1 : len(s) - 1] = 1.0
    return TokenBatch(tokens, mask)


def group_stats(correct: torch.Tensor, rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """``correct, rewards: (G * group_size,)`` prompt-major → degenerate-group fractions and spread."""
    c = correct.float().view(-1, group_size)
    r = rewards.float().view(-1, group_size)
    return {
        "frac_all_correct": float((c.min(1).values == 1).float().mean()),
        "frac_all_wrong": float((c.max(1).values == 0).float().mean()),
        "mean_group_std": float(r.std(1, unbiased=False).mean()),
    }


def logprob_mismatch(learner_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean and max ``|learner - engine|`` log-prob over the masked tokens (``(N, S-1)`` each).
    With an exact weight sync and the same dtype this is float noise; a mapping or sync bug
    shows up here every step."""
    diff = (learner_logp - engine_logp).abs() * mask
    return float(diff.sum() / max(float(mask.sum()), 1.0)), float(diff.max()) if diff.numel() else 0.0
