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
from typing import Any

from pc_megatron.errors import ConfigError
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


def build_reward(cfg: Any) -> Reward:
    """The reward of ``cfg`` (a ``RewardConfig``, ``rewards/config.py``, which imports this module)."""
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
