"""Verifiable rewards: a completion and the reference answer in, a score and a flag out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from pc_megatron.errors import ConfigError, RewardError


@dataclass(frozen=True)
class RewardResult:
    score: float
    correct: bool


class Reward(Protocol):
    def __call__(self, completion: str, answer: str) -> RewardResult: ...


_INT = re.compile(r"^\s*(-?\d+)\s*$")


class IntegerMatchReward:
    """1.0 when the completion is exactly the integer answer (surrounding space allowed), else 0.

    Strict on purpose: a completion with trailing junk is wrong, so the policy learns to stop.
    """

    def __call__(self, completion: str, answer: str) -> RewardResult:
        m = _INT.match(completion)
        ok = m is not None and int(m.group(1)) == int(answer)
        return RewardResult(score=1.0 if ok else 0.0, correct=ok)


REWARDS = {"integer_match": IntegerMatchReward}


@dataclass
class RewardConfig:
    """Reward function applied to each completion."""

    name: str = "integer_match"
    """Registered reward: one of REWARDS."""


def build_reward(cfg: RewardConfig) -> Reward:
    if cfg.name not in REWARDS:
        raise ConfigError(f"reward.name: unknown reward '{cfg.name}'; choose one of {sorted(REWARDS)}")
    return REWARDS[cfg.name]()


def score_all(reward: Reward, completions: list[str], answers: list[str], ids: list[str]) -> list[RewardResult]:
    """Score every completion; a reward that raises is reported with the prompt id and input."""
    out = []
    for text, answer, pid in zip(completions, answers, ids, strict=True):
        try:
            out.append(reward(text, answer))
        except Exception as e:
            raise RewardError(
                f"reward raised {type(e).__name__}: {e} on prompt id '{pid}' (answer {answer!r}, "
                f"completion {text[:80]!r}); fix the reward or the dataset row"
            ) from None
    return out
