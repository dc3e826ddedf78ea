"""``reward.*``: the reward applied to each completion, and the worker pool that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pc_megatron.errors import ConfigError, check_choices
from pc_megatron.rewards import build_reward


@dataclass
class RewardConfig:
    """Reward function applied to each completion, and the worker pool that runs it."""

    name: Literal["integer_match", "math_verify"] = "integer_match"
    """Registered reward: one of REWARDS. Ignored when ``function`` is set."""
    function: str = ""
    """A user reward as ``module:function`` (importable in the workers), called as
    ``f(completion, answer)`` and returning a RewardResult, a bool (correct) or a number (score;
    correct when > 0)."""
    workers: int = 2
    """Reward worker processes."""
    timeout_s: float = 10.0
    """Per completion: a reward still running after this long is stopped (its worker is
    replaced), scored as a failure and counted in ``reward/timeouts``."""
    on_error: Literal["raise", "count"] = "raise"
    """A reward that raises: 'raise' stops the step with the prompt id and the input (a bug in
    the reward or a bad dataset row); 'count' scores it as a failure, counted in
    ``reward/errors``. A worker that crashes is always counted."""
    failure_score: float | None = None
    """Score of a completion whose reward timed out, crashed or (with on_error=count) raised;
    empty = the reward's score for a wrong answer (0 for integer_match and functions, -1 for
    math_verify)."""
    overlong_buffer: int = 0
    """DAPO's overlong penalty: the last this many tokens before rollout.max_new_tokens are a
    buffer in which the score falls linearly by up to ``overlong_penalty`` (and a completion cut
    at the limit loses all of it); 0 = off. Training only; ``correct`` is unchanged."""
    overlong_penalty: float = 1.0
    """The penalty at (and past) the length limit."""
    max_failure_frac: float = 0.5
    """Stop the run with a clear error when more than this share of one call's completions
    (and at least 8) fail: a reward that fails everywhere is broken, not hard."""

    def validate(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"reward.workers={self.workers}: need at least one worker process")
        if self.timeout_s <= 0:
            raise ConfigError(f"reward.timeout_s={self.timeout_s}: must be > 0 seconds")
        check_choices(self, "reward")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ConfigError("reward.overlong_buffer and reward.overlong_penalty must be >= 0")
        if not 0.0 < self.max_failure_frac <= 1.0:
            raise ConfigError(f"reward.max_failure_frac={self.max_failure_frac}: must be in (0, 1]")
        build_reward(self)  # the name or function resolves here, before any worker starts

    def failure(self) -> float:
        """The score of a completion whose reward failed."""
        if self.failure_score is not None:
            return self.failure_score
        return float(getattr(build_reward(self), "incorrect_score", 0.0))
