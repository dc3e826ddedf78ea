"""Generate → decode → score: the one path from prompts to scored completions, used by training
(through the scheduler's ``generate`` seam), held-out evaluation and the pool tools."""

from __future__ import annotations

import hashlib
import itertools

from pc_megatron.data.dataset import PromptRow
from pc_megatron.phases import PhaseTimes
from pc_megatron.rewards import overlong_penalty
from pc_megatron.rewards.pool import RewardPool, Scored
from pc_megatron.rollout.base import Completion, RolloutEngine
from pc_megatron.rollout.config import SamplingParams
from pc_megatron.scheduler import GenRequest, OnGroup, Sample


def encode_prompts(tokenizer, rows: list[PromptRow]) -> list[list[int]]:
    return [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in rows]


def generate_and_score(
    fleet: RolloutEngine,
    tokenizer,
    rewards: RewardPool,
    rows: list[PromptRow],
    prompt_ids: list[list[int]],
    n: int | list[int],
    params: SamplingParams,
    seed: int,
    times: PhaseTimes | None = None,
) -> tuple[list[Completion], Scored]:
    """``n`` completions of each row (per row when a list), in request order, and their rewards;
    the fleet call and the scoring timed as ``rollout`` and ``reward`` into ``times``."""
    times = times or PhaseTimes()
    with times("rollout"):
        completions = fleet.generate(prompt_ids, n, params, seed)
    with times("reward"):
        texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        owners = [rows[c.prompt_index] for c in completions]
        scored = rewards.score(texts, [r.answer for r in owners], [r.id for r in owners])
    return completions, scored


class Rollouts:
    """The scheduler's ``generate`` for one step at a time: each call is one fleet call with its
    own seed, scored by the reward pool, returned as the scheduler's ``Sample`` lists (tagged with
    the weight version the engine served). Counts what the step's calls cost."""

    def __init__(
        self,
        fleet: RolloutEngine,
        rewards: RewardPool,
        tokenizer,
        rows: list[PromptRow],
        params: SamplingParams,
        seed_of,
    ) -> None:
        self.fleet, self.rewards, self.tokenizer, self.rows, self.params = fleet, rewards, tokenizer, rows, params
        self.prompt_ids = encode_prompts(tokenizer, rows)
        self.seed_of = seed_of  # (step, call) -> seed
        self.step, self.times = 0, PhaseTimes()
        self._counts: dict[str, int] = {}

    def begin_step(self, step: int, times: PhaseTimes) -> None:
        self.step, self.times = step, times
        self._counts = {
            "generate_calls": 0,
            "generated_tokens": 0,
            "reward/timeouts": 0,
            "reward/errors": 0,
            "reward/overlong": 0,
        }

    def __call__(self, requests: list[GenRequest]) -> list[list[Sample]]:
        completions, scored = generate_and_score(
            self.fleet,
            self.tokenizer,
            self.rewards,
            [self.rows[r.prompt] for r in requests],
            [self.prompt_ids[r.prompt] for r in requests],
            [r.n for r in requests],
            self.params,
            self.seed_of(self.step, self._counts["generate_calls"]),
            self.times,
        )
        self._counts["generate_calls"] += 1
        samples = self._samples(completions, scored)
        bounds = [0, *itertools.accumulate(r.n for r in requests)]
        return [samples[a:b] for a, b in itertools.pairwise(bounds)]

    def stream(self, requests: list[GenRequest], on_group: OnGroup) -> tuple[list[GenRequest], list[list[Sample]]]:
        """One streamed window (the scheduler's ``GenerateFn.stream``; see ``RolloutEngine.generate_stream``):
        each group scored as soon as its samples are in, and what ``on_group`` asks for added to the
        window. Returns every request made and its samples, in order."""
        made, results = list(requests), {}
        seed = self.seed_of(self.step, self._counts["generate_calls"])

        def scored(i: int, completions: list[Completion]) -> list[tuple[list[int], int]]:
            row = self.rows[made[i].prompt]
            with self.times("reward"):
                texts = self.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
                outcome = self.rewards.score(texts, [row.answer] * len(texts), [row.id] * len(texts))
            results[i] = self._samples(completions, outcome)
            more = on_group(i, results[i])
            made.extend(more)
            return [(self.prompt_ids[q.prompt], q.n) for q in more]

        prompts = [self.prompt_ids[r.prompt] for r in requests]
        with self.times("rollout"):
            self.fleet.generate_stream(prompts, [r.n for r in requests], self.params, seed, scored)
        self._counts["generate_calls"] += 1
        return made, [results[i] for i in range(len(made))]

    def _samples(self, completions: list[Completion], scored: Scored) -> list[Sample]:
        """The scheduler's samples of scored completions (each tagged with the version that sampled it,
        its reward with DAPO's overlong penalty), and the step's counters."""
        self._counts["generated_tokens"] += sum(len(c.token_ids) for c in completions)
        self._counts["reward/timeouts"] += scored.timeouts
        self._counts["reward/errors"] += scored.errors
        cfg = self.rewards.cfg
        penalties = [
            overlong_penalty(len(c.token_ids), self.params.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
            for c in completions
        ]
        self._counts["reward/overlong"] += sum(p < 0 for p in penalties)
        return [
            Sample(r.correct, r.score + p, c.weight_version, c, len(c.token_ids))
            for r, c, p in zip(scored.results, completions, penalties, strict=True)
        ]

    def metrics(self) -> dict[str, int]:
        """The current step's counters."""
        return dict(self._counts)


def stream_seed(seed: int, step: int, stream: int) -> int:
    """Seed of random stream ``stream`` at ``step`` (0 = evaluation, 1 + k = the step's k-th
    generate call): distinct for every (seed, step, stream), however many calls a step makes."""
    digest = hashlib.blake2b(f"{seed}/{step}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1)
