"""What a reward returns (its own module: the rewards in this package import it, and the package's
registry imports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RewardResult:
    score: float
    correct: bool


class Reward(Protocol):
    def __call__(self, completion: str, answer: str) -> RewardResult: ...
