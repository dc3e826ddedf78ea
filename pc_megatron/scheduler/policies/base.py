"""What every allocation policy is (:class:`Policy`), and the pieces more than one of them uses: a
generate call with its accounting (``call``), request rounding to whole engine replicas
(``rounded``), and the piloting policies' own state (:class:`Piloting`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.pool import PromptPool
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, OnGroup, Sample


class Policy(ABC):
    """Fills one step's allocation of up to B groups of n samples from the pool, calling ``generate``
    one or more times. Whatever it carries from one step to the next is an attribute of its own and
    in its ``state_dict``; the pool and the generate function are passed in, never kept."""

    pending: Sequence[Entry] = ()
    """Generated pilots this policy holds for a later call, outside the pool's buffer (none here):
    the step's buffer statistics count them with the buffer."""

    def __init__(self, cfg: SchedulerConfig, prompts_per_step: int, samples_per_prompt: int, seed: int) -> None:
        self.cfg, self.B, self.n, self.seed = cfg, prompts_per_step, samples_per_prompt, seed

    @abstractmethod
    def allocate(self, pool: PromptPool, step: int, generate: GenerateFn) -> Allocation:
        """Step ``step``'s groups and rounds (the scheduler adds the step's statistics)."""

    def state_dict(self) -> dict:
        """What it carries between steps, under the checkpoint's keys (``core.STATE_KEYS``): nothing here."""
        return {}

    def load_state_dict(self, sd: dict) -> None:
        """Reads the keys of :meth:`state_dict` from the scheduler's checkpoint dict (none here)."""
        return None


class Piloting(Policy):
    """A policy that pilots prompts: it numbers its pilot batches (an entry's ``seq``, which ranks
    the recent first) and may hold pilots for a later call."""

    def __init__(self, cfg: SchedulerConfig, prompts_per_step: int, samples_per_prompt: int, seed: int) -> None:
        super().__init__(cfg, prompts_per_step, samples_per_prompt, seed)
        self.n_p = cfg.pilot_size(samples_per_prompt)
        self.pilot_batches = 0
        self.pending: list[Entry] = []

    def state_dict(self) -> dict:
        return {"pilot_batches": self.pilot_batches, "pending": [e.as_tuple() for e in self.pending]}

    def load_state_dict(self, sd: dict) -> None:
        self.pilot_batches = sd["pilot_batches"]
        self.pending = [Entry(*e) for e in sd["pending"]]


def call(pool: PromptPool, generate: GenerateFn, requests: list[GenRequest]) -> list[list[Sample]]:
    """One generate call (none for no requests), its rollouts in the pool's books."""
    if not requests:
        return []
    results = generate(requests)
    pool.record(requests, results)
    return results


def stream_call(
    pool: PromptPool, stream, requests: list[GenRequest], on_group: OnGroup
) -> tuple[list[GenRequest], list[list[Sample]]]:
    """One streamed generate call (``GenerateFn``'s ``stream``): ``requests`` and whatever ``on_group``
    adds as groups finish, generated in one window, in the pool's books."""
    if not requests:
        return [], []
    made, results = stream(requests, on_group)
    pool.record(made, results)
    return made, results


def rounded(k: int, multiple: int, others: int = 0) -> int:
    """``k`` plus the fewest extra prompts that make ``k + others`` a multiple of ``multiple``."""
    return k + (-(k + others)) % multiple
