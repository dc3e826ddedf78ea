"""Arithmetic word problems in plain English, on a difficulty ladder: the task of ``smollm2-arith``.

A pretrained instruct model gets these right or wrong for reasons of its own (it rambles, forgets to
box its answer, slips on a carry), unlike the embedded task's tokens. The ladder spreads its pass
rates from near zero to high, which is what allocation needs to matter: each level is a family
(``meta["family"]``) of its own, so accuracy is also reported per level.

    L1  one step, one-digit numbers ("What is 7 plus 5?")
    L2  one step, + or -, two-digit numbers, in a short story
    L3  one step, x, a one-digit by a one- or two-digit number
    L4  two steps, + and -, two-digit numbers
    L5  one step, + or -, three-digit numbers
    L6  two steps, x then + or -
    L7  three steps, two-digit numbers

An SFT split holds worked examples (``66 + 28 = 94. 94 - 81 = 13. \\boxed{13}``) for a warm-start that
teaches the answer format; the model's arithmetic is its own.

Every answer is a non-negative integer. Generation is deterministic in the seed; the splits are
disjoint by problem text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pc_megatron.data.dataset import PromptRow
from pc_megatron.errors import ConfigError

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo", "Nia"]
THINGS = ["apples", "marbles", "stickers", "pencils", "cards", "shells", "coins", "books", "cookies", "stamps"]
BOXES = ["box", "bag", "jar", "crate", "pack", "basket"]
LEVELS = ("L1", "L2", "L3", "L4", "L5", "L6", "L7")


@dataclass
class WordProblemsConfig:
    """The generated word-problem task (``data.generator=word_problems``)."""

    num_train: int = 6000
    """Training prompts (spread evenly over the levels in ``mix``)."""
    num_eval: int = 600
    """Held-out prompts (``eval_accuracy``), disjoint from the training ones."""
    num_sft: int = 2000
    """Worked examples for an SFT warm-start (the steps, then ``\\boxed{answer}``), disjoint from
    both; used when ``warmstart.enabled``."""
    sft_boxed_frac: float = 1.0
    """Share of the SFT rows whose worked steps end in ``\\boxed{N}``; the others end in plain words
    ("... The answer is 13."). Below 1 the warm-start teaches the steps and leaves part of the
    instruction's format (which the strict reward pays for) to RL."""
    seed: int = 0
    """Seed of the generator (the run's seed does not change the task)."""
    mix: dict[str, float] = field(default_factory=lambda: {"L1": 0.3, **dict.fromkeys(LEVELS[1:], 1.0)})
    """Relative share of each level, L1..L7 (L1 has only a few hundred distinct problems)."""

    def validate(self) -> None:
        unknown = sorted(set(self.mix) - set(LEVELS))
        if unknown or not self.mix or any(v < 0 for v in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ConfigError(
                f"data.word_problems.mix: levels {unknown or list(self.mix)} must be among {list(LEVELS)}, with "
                "non-negative shares that do not all vanish"
            )
        if not 0.0 <= self.sft_boxed_frac <= 1.0:
            raise ConfigError(f"data.word_problems.sft_boxed_frac={self.sft_boxed_frac}: a share, in [0, 1]")
        if self.num_train < 1 or self.num_eval < 1 or self.num_sft < 0:
            raise ConfigError("data.word_problems.num_train and num_eval must be >= 1, num_sft >= 0")


def _l1(r: random.Random) -> tuple[str, int, str]:
    a, b = r.randint(1, 9), r.randint(1, 9)
    if r.random() < 0.5:
        ask = r.choice(
            ["What is {a} plus {b}?", "What is {a} + {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?"]
        )
        return ask.format(a=a, b=b), a + b, f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)
    ask = r.choice(
        ["What is {a} minus {b}?", "What is {a} - {b}?", "Subtract {b} from {a}.", "Take {b} away from {a}."]
    )
    return ask.format(a=a, b=b), a - b, f"{a} - {b} = {a - b}."


def _l2(r: random.Random) -> tuple[str, int, str]:
    n, t = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(10, 99), r.randint(10, 99)
    if r.random() < 0.5:
        return f"{n} has {a} {t} and finds {b} more. How many {t} does {n} have now?", a + b, f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)
    text = f"{n} has {a} {t} and gives {b} of them away. How many {t} does {n} have left?"
    return text, a - b, f"{a} - {b} = {a - b}."


def _l3(r: random.Random) -> tuple[str, int, str]:
    box, t = r.choice(BOXES), r.choice(THINGS)
    per, count = r.randint(2, 25), r.randint(2, 9)
    text = f"Each {box} holds {per} {t}. How many {t} are in {count} {box}s?"
    return text, per * count, f"{count} x {per} = {per * count}."


def _l4(r: random.Random) -> tuple[str, int, str]:
    n, t = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(20, 99), r.randint(10, 60)
    c = r.randint(1, a + b - 1)
    text = f"{n} starts with {a} {t}, buys {b} more, then gives {c} to a friend. How many {t} does {n} have?"
    return text, a + b - c, f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}."


def _l5(r: random.Random) -> tuple[str, int, str]:
    t = r.choice(THINGS)
    a, b = r.randint(100, 999), r.randint(100, 999)
    if r.random() < 0.5:
        text = f"A shop sold {a} {t} on Monday and {b} on Tuesday. How many {t} did it sell in all?"
        return text, a + b, f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)
    text = f"A library had {a} {t}. It lent out {b} of them. How many {t} are still there?"
    return text, a - b, f"{a} - {b} = {a - b}."


def _l6(r: random.Random) -> tuple[str, int, str]:
    n, box, t = r.choice(NAMES), r.choice(BOXES), r.choice(THINGS)
    per, count, extra = r.randint(3, 15), r.randint(2, 9), r.randint(1, 30)
    if r.random() < 0.5:
        text = (
            f"{n} buys {count} {box}s with {per} {t} in each, and gets {extra} more {t} as a gift. "
            f"How many {t} does {n} have?"
        )
        total = per * count + extra
        return text, total, f"{count} x {per} = {per * count}. {per * count} + {extra} = {total}."
    extra = r.randint(1, per * count - 1)
    text = f"{n} has {count} {box}s with {per} {t} in each and eats {extra} of them. How many {t} are left?"
    total = per * count - extra
    return text, total, f"{count} x {per} = {per * count}. {per * count} - {extra} = {total}."


def _l7(r: random.Random) -> tuple[str, int, str]:
    n, m, t = r.choice(NAMES), r.choice(NAMES), r.choice(THINGS)
    a, b, c = r.randint(20, 99), r.randint(10, 99), r.randint(10, 60)
    d = r.randint(1, a + b - c - 1) if a + b - c > 1 else 0
    text = (
        f"{n} has {a} {t}. {m} gives {n} {b} more. {n} then uses {c} of them and loses {d}. "
        f"How many {t} does {n} have now?"
    )
    steps = f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}. {a + b - c} - {d} = {a + b - c - d}."
    return text, a + b - c - d, steps


MAKERS = dict(zip(LEVELS, (_l1, _l2, _l3, _l4, _l5, _l6, _l7), strict=True))


def generate_word_problems(cfg: WordProblemsConfig) -> dict[str, list[PromptRow]]:
    """``{"train": [...], "eval": [...], "sft": [...]}``: problems drawn level by level in proportion
    to ``mix``, each problem text at most once across the splits. Train and eval rows answer with the
    number; SFT rows with the worked steps and the boxed number (``meta["number"]`` holds the number)."""
    cfg.validate()
    r = random.Random(cfg.seed)
    boxing = random.Random(f"{cfg.seed}-boxed")  # its own stream: the share does not change the problems
    total = sum(cfg.mix.values())
    levels = [lv for lv in LEVELS if cfg.mix.get(lv, 0) > 0]
    seen: set[str] = set()
    out: dict[str, list[PromptRow]] = {}
    for split, size in (("eval", cfg.num_eval), ("train", cfg.num_train), ("sft", cfg.num_sft)):
        quotas = {lv: round(size * cfg.mix[lv] / total) for lv in levels}
        quotas[levels[-1]] += size - sum(quotas.values())
        rows = []
        for lv in levels:
            made, tries = 0, 0
            while made < quotas[lv]:
                tries += 1
                if tries > 50 * quotas[lv] + 1000:
                    raise ConfigError(f"data.word_problems: level {lv} ran out of distinct problems; lower num_train")
                text, answer, steps = MAKERS[lv](r)
                if text in seen:
                    continue
                seen.add(text)
                meta = {"family": lv}
                target = str(answer)
                if split == "sft":
                    boxed = boxing.random() < cfg.sft_boxed_frac
                    end = f"\\boxed{{{answer}}}" if boxed else f"The answer is {answer}."
                    target, meta["number"] = f"{steps} {end}", str(answer)
                rows.append(PromptRow(f"{split}-{lv}-{made}", text, target, meta))
                made += 1
        r.shuffle(rows)
        out[split] = rows
    return out
