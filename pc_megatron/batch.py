"""The wire types between the engines and the learner, and the helpers around them: an engine's
``Completion``, the learner's right-padded ``TokenBatch``, completions (or prompt + answer rows) into
token batches, and what came back measured. Torch only: the learner, the engines, their callers and
the update all meet here, below each of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pc_megatron.data.dataset import PromptRow


@dataclass
class Completion:
    """One generated sequence. ``logprobs[i]`` is the engine's log-prob of ``token_ids[i]``
    under ``softmax(logits / temperature)`` (the full distribution, before top-p)."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    weight_version: int = 0
    """The weight version the engine actually served when it sampled this sequence (the oldest of its
    tokens' when an update reached it mid-sequence)."""
    version_spans: list[tuple[int, int]] | None = None
    """``(first token, version)`` of each stretch of tokens sampled by one version, when an update
    reached the sequence mid-way (``rollout.inflight=keep``); None: every token by ``weight_version``."""


@dataclass
class TokenBatch:
    """``tokens: (N, S) int64`` right-padded; ``loss_mask: (N, S-1) float32`` (1 = trained)."""

    tokens: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def rows(self, idx: slice | torch.Tensor) -> TokenBatch:
        return TokenBatch(self.tokens[idx], self.loss_mask[idx])

    def lengths(self) -> list[int]:
        """Tokens of each row that matter: up to the target of its last trained position (mask
        column ``t`` trains ``tokens[t + 1]``); all ``S`` for a row with nothing trained (logits and
        log-probs of whole rows). The right padding after them is never computed."""
        n, s = self.tokens.shape
        trained = self.loss_mask.detach().cpu() != 0
        last = (s - 2) - trained.flip(1).to(torch.int8).argmax(1)
        return torch.where(trained.any(1), last + 2, torch.full((n,), s)).tolist()

    def prompts(self) -> list[tuple[int, ...]]:
        """Each row's untrained lead: its tokens up to the position that predicts its first trained
        token (the prompt, whose hidden states no later token changes), empty for a row with nothing
        trained. Rows with equal leads can share their forward (``learner.share_prompts``)."""
        trained = self.loss_mask.detach().cpu() != 0
        first = trained.to(torch.int8).argmax(1)
        tokens = self.tokens.detach().cpu()
        return [tuple(tokens[i, : int(first[i]) + 1].tolist()) if trained[i].any() else () for i in range(len(tokens))]


def completions_to_batch(
    prompts: list[list[int]], completions: list[Completion], pad_id: int
) -> tuple[TokenBatch, torch.Tensor]:
    """Row ``i`` is ``prompts[i] + completions[i].token_ids`` (``prompts``: each row's prompt token
    ids, one per completion). Return the batch (``loss_mask`` on the generated tokens) and the
    engine's sampling log-probs aligned with it, ``(N, S-1) float32`` (0 where the mask is 0)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions: give each row its prompt")
    seqs = [p + c.token_ids for p, c in zip(prompts, completions, strict=True)]
    width = max(map(len, seqs))
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    engine_logp = torch.zeros((len(seqs), width - 1))
    for i, (seq, c) in enumerate(zip(seqs, completions, strict=True)):
        start = len(prompts[i]) - 1
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
