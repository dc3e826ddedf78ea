"""The embedded task: integer arithmetic with a wide spread of difficulty.

Each prompt is an expression such as ``47*8=`` and its answer the integer result. Families
range from trivially solved by a tiny model after warm-start (one-digit sums) to hopeless
(two-by-two-digit products), like a real math set for a 1.5B model. Everything is a pure
function of the seed; the splits are disjoint by prompt text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict

from pc_megatron.data.dataset import PromptRow
from pc_megatron.embedded.config import SyntheticTaskConfig


def _add(rng: random.Random, lo: int, hi: int) -> tuple[str, int]:
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    return f"{a}+{b}=", a + b


def _sub(rng: random.Random, lo: int, hi: int) -> tuple[str, int]:
    a = rng.randint(lo, hi)
    b = rng.randint(0, a)
    return f"{a}-{b}=", a - b


def _mul(rng: random.Random, a_range: tuple[int, int], b_range: tuple[int, int]) -> tuple[str, int]:
    a, b = rng.randint(*a_range), rng.randint(*b_range)
    return f"{a}*{b}=", a * b


def _add3(rng: random.Random) -> tuple[str, int]:
    a, b, c = (rng.randint(10, 99) for _ in range(3))
    return f"{a}+{b}+{c}=", a + b + c


FAMILIES: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "add1": lambda r: _add(r, 0, 9),
    "add2": lambda r: _add(r, 10, 99),
    "add3": lambda r: _add(r, 100, 999),
    "sub2": lambda r: _sub(r, 10, 99),
    "sub3": lambda r: _sub(r, 100, 999),
    "mul1": lambda r: _mul(r, (0, 9), (0, 9)),
    "mul21": lambda r: _mul(r, (10, 99), (2, 9)),
    "mul22": lambda r: _mul(r, (10, 99), (10, 99)),
    "addthree": _add3,
}


POOLS = ("hard", "easy", "graded")
# fields that do not change the base splits (they select the RL pool, or draw after it)
POOL_FIELDS = ("pool", "easy_pass_band", "hopeless_frac", "solved_frac", "pool_size", "num_eval_expected")


def split_fields(cfg: SyntheticTaskConfig) -> dict:
    """The fields that determine generate_splits (and so the SFT rows and the warm-start)."""
    return {k: v for k, v in asdict(cfg).items() if k not in POOL_FIELDS}


def validate_pool(pool: str, band: list[float], hopeless_frac: float = 0.0, solved_frac: float = 0.0) -> None:
    from pc_megatron.errors import ConfigError

    if not (0 <= hopeless_frac and 0 <= solved_frac and hopeless_frac + solved_frac <= 1):
        raise ConfigError(
            f"data.synthetic.hopeless_frac={hopeless_frac} and solved_frac={solved_frac} must be >= 0 with a sum <= 1"
        )
    if pool != "graded" and (hopeless_frac or solved_frac):
        raise ConfigError(
            "data.synthetic.hopeless_frac / solved_frac shape the graded pool: set data.synthetic.pool=graded"
        )

    if pool not in POOLS:
        raise ConfigError(f"data.synthetic.pool: unknown pool {pool!r}; valid pools: {', '.join(POOLS)}")
    if len(band) != 2 or not 0 <= band[0] <= band[1] <= 1:
        raise ConfigError(f"data.synthetic.easy_pass_band must be [low, high] with 0 <= low <= high <= 1 (got {band})")


def validate_mix(mix: dict[str, float]) -> None:
    from pc_megatron.errors import ConfigError

    unknown = sorted(set(mix) - set(FAMILIES))
    if unknown:
        raise ConfigError(f"data.synthetic.mix: unknown family {unknown}; valid families: {sorted(FAMILIES)}")
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ConfigError("data.synthetic.mix: weights must be >= 0 and not all zero")


def _draw(rng: random.Random, mix: dict[str, float], count: int, exclude: set[str]) -> list[PromptRow]:
    names = [k for k, w in mix.items() if w > 0]
    weights = [mix[k] for k in names]
    rows: list[PromptRow] = []
    attempts = 0
    while len(rows) < count and attempts < 200 * count:
        attempts += 1
        family = rng.choices(names, weights)[0]
        prompt, answer = FAMILIES[family](rng)
        if prompt in exclude:
            continue
        exclude.add(prompt)
        rows.append(PromptRow(id="", prompt=prompt, answer=str(answer), meta={"family": family}))
    return rows


def generate_splits(cfg: SyntheticTaskConfig) -> dict[str, list[PromptRow]]:
    """Return ``{"train", "eval", "sft"}`` rows. The held-out prompts never appear elsewhere;
    train and SFT may share prompts (as an SFT set and an RL set drawn from one corpus do)."""
    validate_mix(cfg.mix)
    rng = random.Random(cfg.seed)
    taken: set[str] = set()
    eval_rows = _draw(rng, cfg.mix, cfg.num_eval, taken)
    train_rows = _draw(rng, cfg.mix, cfg.num_train, set(taken))
    sft_rows = _draw(rng, cfg.mix, cfg.num_sft, set(taken))

    return {"train": _named(train_rows, "train"), "eval": _named(eval_rows, "eval"), "sft": _named(sft_rows, "sft")}


def _named(rows: list[PromptRow], split: str) -> list[PromptRow]:
    return [PromptRow(f"{split}-{i}", r.prompt, r.answer, r.meta) for i, r in enumerate(rows)]


def pool_candidates(cfg: SyntheticTaskConfig, count: int, exclude: set[str], chunk: int) -> list[PromptRow]:
    """Chunk ``chunk`` (0, 1, ...) of a stream of distinct candidate prompts drawn from ``mix``,
    none in ``exclude``; a pure function of (seed, chunk, exclude). Empty when the prompt space
    is exhausted."""
    rows = _draw(random.Random(f"{cfg.seed}/candidates/{chunk}"), cfg.mix, count, set(exclude))
    return _named(rows, f"cand{chunk}")


def expected_eval_rows(cfg: SyntheticTaskConfig, exclude: set[str]) -> list[PromptRow]:
    """``cfg.num_eval_expected`` held-out prompts from ``mix``, none in ``exclude`` (every prompt
    of the task's splits and RL pool); a pure function of (seed, exclude)."""
    rows = _draw(random.Random(f"{cfg.seed}/eval-expected"), cfg.mix, cfg.num_eval_expected, set(exclude))
    return _named(rows, "xeval")
