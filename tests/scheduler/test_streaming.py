"""Pilot→commit streamed inside one generate window (``PilotCommit._streamed_round``): the same
allocation decisions as the round with a barrier between pilot and commit, for the same rewards."""

from __future__ import annotations

import random

import pytest

from pc_megatron.scheduler import GenRequest, Sample, Scheduler, SchedulerConfig


class Oracle:
    """Rewards as a function of (prompt, phase, sample index) alone, so that the same prompts get the
    same rewards however the requests are batched, ordered or streamed."""

    def __init__(self, rates: list[float]) -> None:
        self.rates = rates
        self.calls = 0

    def draw(self, q: GenRequest) -> list[Sample]:
        rng = random.Random(f"{q.prompt}/{q.phase}")
        return [Sample(c, float(c), 0, None, 3) for c in (rng.random() < self.rates[q.prompt] for _ in range(q.n))]

    def __call__(self, requests: list[GenRequest]) -> list[list[Sample]]:
        self.calls += 1
        return [self.draw(q) for q in requests]


class StreamingOracle(Oracle):
    """The same rewards, with ``stream``: groups finish in a random order; what ``on_group`` returns
    joins the window and finishes later, in a random order too."""

    def __init__(self, rates: list[float], seed: int) -> None:
        super().__init__(rates)
        self.rng = random.Random(seed)
        self.early = 0  # commits added while pilots were still out

    def stream(self, requests, on_group):
        self.calls += 1
        made, results = list(requests), [self.draw(q) for q in requests]
        out = list(range(len(made)))
        while out:
            i = out.pop(self.rng.randrange(len(out)))
            for q in on_group(i, results[i]):
                self.early += any(j < len(requests) for j in out)
                made.append(q)
                results.append(self.draw(q))
                out.append(len(made) - 1)
        return made, results


def _trail(generate, selection: str, steps: int, rates: list[float], B: int) -> list:
    cfg = SchedulerConfig(policy="pilot_commit", bind=False, selection=selection, max_off_steps=2)
    sched = Scheduler(cfg, len(rates), B, 16, seed=5)
    trail = []
    for step in range(1, steps + 1):
        allocation = sched.next_batch(step, generate, policy_version=step)
        trail.append(
            (
                [(g.prompt, g.pilot_samples, [s.correct for s in g.samples]) for g in allocation.groups],
                allocation.rounds,
                {k: v for k, v in allocation.stats.items() if not k.startswith(("cum_", "step_"))},
            )
        )
    counts = {k: v for k, v in sched.pool.counts.items()}
    return [trail, counts, sorted(sched.pool.state.items())]


@pytest.mark.parametrize("selection", ["max_variance", "random"])
@pytest.mark.parametrize("B", [4, 8])
def test_streamed_rounds_commit_what_the_barrier_commits(selection, B):
    rates = [random.Random(f"r{p}").choice([0.0, 0.05, 0.2, 0.4, 0.5, 0.6, 0.8, 0.95, 1.0]) for p in range(400)]
    barrier = _trail(Oracle(rates), selection, 30, rates, B)
    for seed in range(3):
        streaming = StreamingOracle(rates, seed)
        assert _trail(streaming, selection, 30, rates, B) == barrier
        if selection == "max_variance":
            assert streaming.early > 0  # commits did start while pilots were out: the test is not vacuous


def test_a_commit_starts_only_when_its_selection_is_certain():
    """The rule itself: with B = 1 and two pilots out, a scored mixed pilot at p̂ = 0.5 is not
    committed while an unscored pilot of a smaller prompt id could still tie it and win."""
    from pc_megatron.scheduler.pool import PromptPool
    from pc_megatron.scheduler.types import Entry

    pool = PromptPool(10, seed=0, capacity=8, max_off_steps=4)
    half = [Sample(True, 1.0), Sample(False, 0.0)] * 2
    pool.buffer_entry(Entry(5, half, 1, 3))
    assert pool.surely_selected(1, set(), "max_variance", [2], seq=3, best_variance=0.25) == []
    assert pool.surely_selected(1, set(), "max_variance", [7], seq=3, best_variance=0.25)[0].prompt == 5
