"""What the scheduler exchanges with the rollout side (requests, samples) and the learner (groups,
allocations), and its buffered pilots. Plain data: no engine, model or policy code.

Checkpoints written by ``torch.save`` pickle :class:`Sample` by this module's path: it stays here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenRequest:
    prompt: int
    n: int
    phase: str  # "full" | "pilot" | "commit"


@dataclass
class Sample:
    correct: bool
    reward: float
    policy_version: int = 0
    payload: Any = None  # the engine's completion, opaque here
    tokens: int = 0  # generated tokens, for the token accounting


@dataclass
class Group:
    """One trained group: all samples share a baseline (pilot ∪ commit for Pilot-Commit)."""

    prompt: int
    samples: list[Sample]
    pilot_samples: int = 0


@dataclass
class Entry:
    """A buffered (or pending) pilot: its prompt and samples so far."""

    prompt: int
    samples: list[Sample]
    gen_step: int  # the step that generated this pilot (its policy lag when trained at step t: t - gen_step)
    seq: int = 0  # which pilot batch it came from (the same in bound and unbound mode): "recent" for ties

    @property
    def p_hat(self) -> float:
        return sum(s.correct for s in self.samples) / len(self.samples)

    def as_tuple(self) -> tuple[int, list[Sample], int, int]:
        """Its form in a checkpoint (``Entry(*t)`` reads it back)."""
        return (self.prompt, self.samples, self.gen_step, self.seq)


@dataclass
class Allocation:
    """One step's allocation: the groups to train (possibly fewer than B), the generate rounds it
    took, and the step's statistics (filled by the scheduler)."""

    groups: list[Group]
    rounds: int
    stats: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The step's metrics row: the stats under ``sched/``, and the cumulative rollouts and
        generated tokens that the accuracy curves are plotted against."""
        return {
            "cum_rollouts": self.stats["cum_generated"],
            "cum_generated_tokens": self.stats["cum_tokens_generated"],
            **{f"sched/{k}": v for k, v in self.stats.items()},
        }


GenerateFn = Callable[[list[GenRequest]], list[list[Sample]]]
"""One generate call: each request's samples, in request order. A generate function may also have
``stream(requests, on_group) -> (requests, results)``: the requests generated together, and each time
one request's samples are all scored, ``on_group(index, samples)`` returns more requests to add to the
same window (their indexes follow); it returns every request made, in order, with its samples."""

OnGroup = Callable[[int, list[Sample]], list[GenRequest]]
