"""Verifiable rewards: a completion and the reference answer in, a score and a flag out."""

from __future__ import annotations

import re
import threading
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
    timeout_s: float = 60.0
    """Scoring a step's completions taking longer than this fails the step with a clear error."""


def build_reward(cfg: RewardConfig) -> Reward:
    if cfg.name not in REWARDS:
        raise ConfigError(f"reward.name: unknown reward '{cfg.name}'; choose one of {sorted(REWARDS)}")
    return REWARDS[cfg.name]()


def score_all(
    reward: Reward, completions: list[str], answers: list[str], ids: list[str], timeout_s: float | None = None
) -> list[RewardResult]:
    """Score every completion. A reward that raises is reported with the prompt id and input;
    one that hangs past ``timeout_s`` fails the step (a daemon thread: it cannot block exit)."""
    if timeout_s is None:
        return _score(reward, completions, answers, ids)
    box: dict = {}

    def work() -> None:
        try:
            box["out"] = _score(reward, completions, answers, ids)
        except BaseException as e:
            box["err"] = e

    worker = threading.Thread(target=work, daemon=True, name="reward")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardError(
            f"reward did not finish {len(completions)} completions within reward.timeout_s={timeout_s:g}; "
            "fix the hanging reward or raise the timeout"
        )
    if "err" in box:
        raise box["err"]
    return box["out"]


def _score(reward: Reward, completions: list[str], answers: list[str], ids: list[str]) -> list[RewardResult]:
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
