"""What the run knows about each prompt's pass rate, for ``scheduler.policy=adaptive``.

Each prompt's evidence is its (correct, total) samples so far, every sample of every phase, discounted by
``forget`` per policy step since it was seen (the policy moves, so old outcomes count for less).
The posterior over its pass rate p lives on a grid of p in [0, 1] (with exact 0 and 1: many
prompts of a real pool are never or always solved) under a **population prior** learned from
every prompt's evidence (one EM step per refit: the prior is the mean of the prompts'
posteriors), so a prompt seen once, or never, is judged by what the pool looks like: in a pool
where most prompts are solved or hopeless, a 0/4 pilot means "hopeless", and in a pool where
most are informative, an unseen prompt is worth a full group without any pilot.

Pure Python (the scheduler imports no torch).
"""

from __future__ import annotations

# Pass rates the posterior can take: dense near 0 and 1, where an n-sample group's chance of being
# mixed changes fastest (at n = 32: 15% at p = 0.005, 48% at p = 0.02). A uniform grid of step
# 0.02 could not tell a prompt solved 99.5% of the time from one solved 98%: every all-correct
# pilot then looked 48% likely to give a mixed group, was committed, and came back all correct
# (29% of the trained groups on the graded pool: docs/LOG.md, 2026-12-04).
_EDGE = (0.0, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1)
GRID = (*_EDGE, *(round(0.15 + 0.05 * i, 2) for i in range(15)), *(round(1 - x, 3) for x in reversed(_EDGE)))
# uniform in p: each grid point weighs the width of the interval it stands for
_CELLS = [(min(GRID[i + 1], 1.0) - max(GRID[i - 1], 0.0)) / 2 for i in range(1, len(GRID) - 1)]
_FLAT = tuple(w / 1.0 for w in (GRID[1] / 2, *_CELLS, (1 - GRID[-2]) / 2))


class PassRateBelief:
    def __init__(self, forget: float) -> None:
        self.forget = forget
        self.evidence: dict[int, tuple[float, float, int]] = {}  # prompt -> (correct, total, step seen)
        self.prior: tuple[float, ...] = _FLAT

    def _counts(self, prompt: int, step: int) -> tuple[float, float]:
        e = self.evidence.get(prompt)
        if e is None:
            return 0.0, 0.0
        f = self.forget ** max(step - e[2], 0)
        return e[0] * f, e[1] * f

    def seen(self, prompt: int) -> bool:
        return prompt in self.evidence

    def observe(self, prompt: int, correct: list[bool], step: int) -> None:
        k, m = self._counts(prompt, step)
        self.evidence[prompt] = (k + sum(correct), m + len(correct), step)

    def posterior(self, prompt: int, step: int) -> list[float]:
        k, m = self._counts(prompt, step)
        w = [q * p**k * (1 - p) ** (m - k) for q, p in zip(self.prior, GRID, strict=True)]
        total = sum(w)
        return [x / total for x in w] if total > 0 else list(self.prior)

    def mixed_prob(self, prompt: int, step: int, n: int) -> float:
        """P(an n-sample group of this prompt has both right and wrong samples)."""
        post = self.posterior(prompt, step)
        return sum(w * (1 - p**n - (1 - p) ** n) for w, p in zip(post, GRID, strict=True))

    def all_correct_prob(self, prompt: int, step: int, n: int) -> float:
        post = self.posterior(prompt, step)
        return sum(w * p**n for w, p in zip(post, GRID, strict=True))

    def refit(self, step: int) -> None:
        """One EM step of the population prior over every prompt with evidence (lightly
        smoothed toward flat, so no grid point is ruled out for good)."""
        if not self.evidence:
            return
        acc = [0.0] * len(GRID)
        for prompt in self.evidence:
            for i, w in enumerate(self.posterior(prompt, step)):
                acc[i] += w
        total = sum(acc)
        self.prior = tuple(0.98 * a / total + 0.02 * f for a, f in zip(acc, _FLAT, strict=True))

    def state_dict(self) -> dict:
        return {"evidence": dict(self.evidence), "prior": list(self.prior)}

    def load_state_dict(self, sd: dict) -> None:
        self.evidence = {int(p): tuple(v) for p, v in sd["evidence"].items()}
        self.prior = tuple(sd["prior"])
