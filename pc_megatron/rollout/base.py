"""The rollout-engine protocol and its config."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from pc_megatron.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens besides the tokenizer's EOS."""


@dataclass
class Completion:
    """One generated sequence. ``logprobs[i]`` is the engine's log-prob of ``token_ids[i]``
    under ``softmax(logits / temperature)`` (the full distribution, before top-p)."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


class RolloutEngine(Protocol):
    def generate(
        self, prompts: list[list[int]], n: int | list[int], params: SamplingParams, seed: int
    ) -> list[Completion]:
        """``n`` completions per prompt (or ``n[i]`` for prompt i: a pilot and a commit share
        one call), prompt-major. A pure function of (weights, prompts, n, params, seed)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with these HF-named tensors (every weight, every step)."""
        ...


@dataclass
class RolloutConfig:
    """Rollout engine and sampling."""

    backend: str = "hf"
    """'hf' (transformers; CPU and tests). The vLLM backend is the GPU production path."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (the learner's log-probs use it too)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 8
    """Longest completion, in tokens."""
    max_batch_size: int = 512
    """Sequences per engine forward batch."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides EOS."""

    def validate(self) -> None:
        if self.backend not in ("hf",):
            raise ConfigError(f"rollout.backend: '{self.backend}' is not available; use 'hf'")
        if self.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training rollouts")
        if not 0 < self.top_p <= 1:
            raise ConfigError("rollout.top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ConfigError("rollout.max_new_tokens must be >= 1")

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, tuple(self.stop_token_ids))


def build_engine(cfg: RolloutConfig, model_dir: str | Path) -> RolloutEngine:
    cfg.validate()
    from pc_megatron.rollout.hf_engine import HFEngine

    return HFEngine(model_dir, max_batch_size=cfg.max_batch_size)
