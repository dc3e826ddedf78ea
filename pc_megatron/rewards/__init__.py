"""Verifiable rewards: a completion and the reference answer in, a score and a flag out.

A reward is a name from ``REWARDS`` or any importable function ``module:function`` taking
``(completion, answer)`` and returning a ``RewardResult``, a bool or a number (the way TRL takes
reward functions). Rewards run in a pool of worker processes with a per-item timeout
(``rewards/pool.py``), so a reward that hangs or crashes on one input costs one item, not the run.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pc_megatron.errors import ConfigError, check_choices
from pc_megatron.rewards.result import Reward, RewardResult

_INT = re.compile(r"^\s*(-?\d+)\s*$")


class IntegerMatchReward:
    """1.0 when the completion is exactly the integer answer (surrounding space allowed), else 0.

    Strict on purpose: a completion with trailing junk is wrong, so the policy learns to stop.
    """

    incorrect_score = 0.0

    @staticmethod
    def extract(completion: str) -> str | None:
        """The integer the completion is, or None."""
        m = _INT.match(completion)
        return m.group(1) if m else None

    def __call__(self, completion: str, answer: str) -> RewardResult:
        got = self.extract(completion)
        ok = got is not None and int(got) == int(answer)
        return RewardResult(score=1.0 if ok else 0.0, correct=ok)


def _math_verify() -> Reward:
    from pc_megatron.rewards.math import MathVerifyReward

    return MathVerifyReward()


REWARDS: dict[str, Callable[[], Reward]] = {"integer_match": IntegerMatchReward, "math_verify": _math_verify}


@dataclass
class RewardConfig:
    """Reward function applied to each completion, and the worker pool that runs it."""

    name: str = "integer_match"
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


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment of a ``length``-token completion (<= 0): nothing up to
    ``max_len - buffer``, then linear down to ``-factor`` at ``max_len``."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return -factor * min(1.0, (length - (max_len - buffer)) / buffer)


class _FunctionReward:
    incorrect_score = 0.0

    def __init__(self, fn: Callable[[str, str], Any], spec: str) -> None:
        self.fn, self.spec = fn, spec

    def __call__(self, completion: str, answer: str) -> RewardResult:
        out = self.fn(completion, answer)
        if isinstance(out, RewardResult):
            return out
        if isinstance(out, bool):
            return RewardResult(float(out), out)
        if isinstance(out, (int, float)):
            return RewardResult(float(out), out > 0)
        raise TypeError(f"reward.function {self.spec} returned {type(out).__name__}; return a bool or a number")


def build_reward(cfg: RewardConfig) -> Reward:
    if cfg.function:
        module, sep, attr = cfg.function.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(f"reward.function='{cfg.function}': write it as module:function")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                f"reward.function='{cfg.function}' cannot be loaded ({type(e).__name__}: {e}); "
                "make the module importable (installed or on PYTHONPATH)"
            ) from None
        if not callable(fn):
            raise ConfigError(f"reward.function='{cfg.function}' is not callable")
        return _FunctionReward(fn, cfg.function)
    if cfg.name not in REWARDS:
        raise ConfigError(f"reward.name: unknown reward '{cfg.name}'; choose one of {sorted(REWARDS)}")
    return REWARDS[cfg.name]()
