"""The prompt pool a run draws from, and the books kept on it: each prompt's state in the epoch, the
epoch's order and cursor, the replay buffer of mixed pilots waiting for their commits, and the
accounting of every rollout generated (trained, wasted, or still waiting) in samples and tokens.

The policies (``policies/``) decide what to generate and how to file what came back; every change
of a prompt's state (drawn, evicted, deferred, buffered, taken to commit, dropped) and the books of
every generate call go through a method here, so each has one place. A policy bumps the counters of
its own decisions (``counts["skipped_easy"]`` and the like) and the step's ``pilot_hist`` itself.
"""

from __future__ import annotations

import bisect
import math
import random
from itertools import accumulate

from pc_megatron.data.sampler import epoch_permutation
from pc_megatron.scheduler.config import Selection
from pc_megatron.scheduler.types import Entry, GenRequest, Sample

ROLLOUT_KEYS = (  # rollout counters, also kept in generated tokens
    "generated",
    "trained",
    "wasted_filtered",
    "wasted_flushed",
    "wasted_surplus",
    "wasted_degenerate",
    "generated_pilot",
    "generated_commit",
)
COUNT_KEYS = (
    *ROLLOUT_KEYS,
    "evicted",
    "deferred",
    "skipped_easy",
    "skipped_confident",
    "direct_groups",
    "extended",
    "groups_full",
    "degenerate_full",
    "groups_pilot",
    "degenerate_pilot",
)


class PromptPool:
    """Prompts ``0 .. num_prompts - 1``, each fresh | used (drawn this epoch) | buffered | deferred (to
    the next epoch) | evicted (for good); the replay buffer (prompt -> :class:`Entry`) of at most
    ``capacity`` entries, none older than ``max_off_steps`` after a step; the counters."""

    def __init__(self, num_prompts: int, seed: int, capacity: int, max_off_steps: int) -> None:
        self.N, self.seed, self.capacity, self.max_off_steps = num_prompts, seed, capacity, max_off_steps
        self.epoch, self.cursor = 0, 0
        self.state: dict[int, str] = dict.fromkeys(range(num_prompts), "fresh")
        self.buffer: dict[int, Entry] = {}
        self.counts: dict[str, int] = dict.fromkeys(COUNT_KEYS, 0)
        self.tokens: dict[str, int] = dict.fromkeys(ROLLOUT_KEYS, 0)  # the same, in generated tokens
        self.n_deferred = 0  # prompts in state "deferred" (a count kept, not a scan over the pool)
        self.pilot_hist: list[int] = []  # this step's filed pilots by number correct (the scheduler sizes it)
        self._order_cache: tuple[int, list[int]] = (-1, [])

    # ------------------------------------------------------------------ accounting
    def add(self, key: str, samples: list[Sample]) -> None:
        self.counts[key] += len(samples)
        self.tokens[key] += sum(s.tokens for s in samples)

    def record(self, requests: list[GenRequest], results: list[list[Sample]]) -> None:
        """The books of one generate call: rollouts by phase, and groups of all-equal rewards."""
        for req, samples in zip(requests, results, strict=True):
            if len(samples) != req.n:
                raise ValueError(f"generate returned {len(samples)} samples for prompt {req.prompt}, asked {req.n}")
            self.add("generated", samples)
            if req.phase in ("pilot", "commit"):
                self.add(f"generated_{req.phase}", samples)
            if req.phase in ("full", "pilot"):  # a degenerate group: every reward equal, zero advantage
                self.counts[f"groups_{req.phase}"] += 1
                self.counts[f"degenerate_{req.phase}"] += len({s.reward for s in samples}) == 1

    # ------------------------------------------------------------------ drawing
    def _order(self, epoch: int) -> list[int]:
        """The epoch's prompt order: a pure function of (seed, epoch), computed once per epoch."""
        if self._order_cache[0] != epoch:
            self._order_cache = (epoch, epoch_permutation(self.N, self.seed, epoch).tolist())
        return self._order_cache[1]

    def _new_epoch(self, drawn_now: list[int]) -> None:
        for e in self.buffer.values():  # the buffer is cleared at the epoch boundary
            self.add("wasted_flushed", e.samples)
        self.buffer.clear()
        self.n_deferred = 0  # every deferred prompt is fresh again
        self.epoch, self.cursor = self.epoch + 1, 0
        for p, s in self.state.items():
            if s != "evicted":
                self.state[p] = "fresh"
        for p in drawn_now:  # drawn by the call that crossed the boundary: not again in it
            self.state[p] = "used"

    def fresh(self, k: int, exclude: frozenset[int] | set[int] = frozenset()) -> list[int]:
        """Up to k prompts not yet drawn this epoch (and not in ``exclude``: this batch's
        prompts, should the epoch wrap mid-batch); opens a new epoch when this one runs out."""
        out: list[int] = []
        started_new = False
        while len(out) < k:
            order = self._order(self.epoch)
            while self.cursor < self.N and len(out) < k:
                p = order[self.cursor]
                self.cursor += 1
                if self.state[p] == "fresh" and p not in exclude:
                    out.append(p)
                    self.state[p] = "used"  # now, so a wrap inside this call cannot draw it twice
            if len(out) < k:
                if started_new or all(s == "evicted" for s in self.state.values()):
                    break  # the whole pool is evicted or already drawn: return what there is
                self._new_epoch(out)
                started_new = True
        return out

    # ------------------------------------------------------------------ filing
    def evict(self, prompt: int) -> None:
        """Out of the pool for good (solved)."""
        self.state[prompt] = "evicted"
        self.counts["evicted"] += 1

    def defer(self, prompt: int, counted: bool = True) -> None:
        """Not drawn again this epoch (fresh at the next); ``counted``: in the ``deferred`` counter."""
        self.state[prompt] = "deferred"
        self.n_deferred += 1
        self.counts["deferred"] += counted

    def buffer_entry(self, entry: Entry) -> None:
        """A mixed pilot into the replay buffer, to be committed."""
        self.buffer[entry.prompt] = entry
        self.state[entry.prompt] = "buffered"

    # ------------------------------------------------------------------ the buffer
    def select(
        self, step: int, rnd: int, need: int, taken: set[int], selection: Selection, n: int, budget: float = math.inf
    ) -> list[Entry]:
        """Take out of the buffer, to commit, up to ``need`` prompts not already in this batch (an
        epoch can wrap mid-step and pilot a prompt that this batch already trains), in ``selection``
        order, whose commits (up to ``n`` samples each) fit in ``budget`` rollouts."""
        entries = sorted((e for e in self.buffer.values() if e.prompt not in taken), key=lambda e: e.prompt)
        if len(entries) > need:
            if selection == "random":
                entries = random.Random(f"{self.seed}/select/{step}/{rnd}").sample(entries, need)
            else:
                entries.sort(key=self.priority)
                entries = entries[:need]
        # the running commit cost only grows, so the entries that fit are a prefix
        entries = entries[: sum(1 for total in accumulate(n - len(e.samples) for e in entries) if total <= budget)]
        self._take(entries)
        return entries

    @staticmethod
    def priority(e: Entry) -> tuple[float, int, int]:
        """``max_variance``'s order (smallest first): p̂(1 - p̂) high first, ties to the most recent pilot
        batch, then to the smaller prompt."""
        return (-e.p_hat * (1 - e.p_hat), -e.seq, e.prompt)

    def surely_selected(
        self, need: int, taken: set[int], selection: Selection, unscored: list[int], seq: int, best_variance: float
    ) -> list[Entry]:
        """The buffered entries that ``select(..., need, taken, selection, ...)`` will take whatever the
        pilots still generating (``unscored``: their prompts, of pilot batch ``seq``) come back with,
        each of which can at best be buffered with p̂(1 - p̂) = ``best_variance``. Taken out of the
        buffer (a streamed round commits them at once). Without a budget: ``select``'s prefix."""
        entries = [e for e in self.buffer.values() if e.prompt not in taken]
        if len(entries) + len(unscored) <= need:  # every candidate is taken, in any order
            sure = entries
        elif selection == "random":
            sure = []  # the draw needs every candidate
        else:
            ranked = sorted(entries, key=self.priority)
            best = sorted((-best_variance, -seq, p) for p in unscored)
            sure = []
            for rank, e in enumerate(ranked):  # e's rank among the known, plus the unscored that could pass it
                if rank + bisect.bisect_left(best, self.priority(e)) >= need:
                    break
                sure.append(e)
        self._take(sure)
        return sure

    def selection_order(self, entries: list[Entry], truncated: bool) -> list[Entry]:
        """``entries`` in the order ``select`` lists them: by prompt when it took every candidate, by
        ``max_variance``'s priority when it had to choose (``truncated``)."""
        return sorted(entries, key=self.priority if truncated else (lambda e: e.prompt))

    def _take(self, entries: list[Entry]) -> None:
        for e in entries:
            del self.buffer[e.prompt]
            self.state[e.prompt] = "used"

    def _drop(self, entries: list[Entry]) -> None:
        self._take(entries)
        for e in entries:
            self.add("wasted_flushed", e.samples)

    def enforce_capacity(self) -> None:
        """After each round: the oldest entries beyond the capacity go first."""
        by_age = sorted(self.buffer.values(), key=lambda e: (e.seq, e.prompt))
        self._drop(by_age[: max(len(self.buffer) - self.capacity, 0)])

    def flush_stale(self, step: int) -> None:
        """After the batch is filled: entries generated more than ``max_off_steps`` steps ago go
        (pilots a policy holds pending are not in the buffer: bound ones were generated this step)."""
        self._drop([e for e in self.buffer.values() if step - e.gen_step > self.max_off_steps])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "state": dict(self.state),
            "counts": dict(self.counts),
            "tokens": dict(self.tokens),
            "buffer": [e.as_tuple() for e in self.buffer.values()],
        }

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["state"]) != self.N:
            raise ValueError(f"scheduler state is for {len(sd['state'])} prompts, this pool has {self.N}")
        self.epoch, self.cursor = sd["epoch"], sd["cursor"]
        self.state, self.counts, self.tokens = dict(sd["state"]), dict(sd["counts"]), dict(sd["tokens"])
        self.n_deferred = sum(s == "deferred" for s in self.state.values())
        self.buffer = {e[0]: Entry(*e) for e in sd["buffer"]}
