"""Arithmetic word problems (``pc_megatron/data/word_problems.py``), the task of the real-model recipe."""

import pytest

from pc_megatron.data.word_problems import LEVELS, WordProblemsConfig, generate_word_problems
from pc_megatron.errors import ConfigError


def test_word_problems_are_disjoint_deterministic_and_answered():
    cfg = WordProblemsConfig(num_train=300, num_eval=60, num_sft=70, seed=3)
    a, b = generate_word_problems(cfg), generate_word_problems(cfg)
    assert {k: [r.prompt for r in v] for k, v in a.items()} == {k: [r.prompt for r in v] for k, v in b.items()}
    texts = [r.prompt for split in a.values() for r in split]
    assert len(texts) == len(set(texts)) == 430
    assert {r.meta["family"] for r in a["train"]} == set(LEVELS)
    for r in a["train"] + a["eval"]:
        assert int(r.answer) >= 0
    for r in a["sft"]:  # worked steps, then the boxed number
        assert r.answer.endswith(f"\\boxed{{{r.meta['number']}}}") and str(eval_steps(r.answer)) == r.meta["number"]


def test_sft_rows_leave_the_box_to_rl_at_the_share_asked_and_keep_the_same_problems():
    sizes = dict(num_train=50, num_eval=10, num_sft=400, seed=1)
    full = generate_word_problems(WordProblemsConfig(**sizes))
    half = generate_word_problems(WordProblemsConfig(**sizes, sft_boxed_frac=0.5))
    assert [r.prompt for r in half["sft"]] == [r.prompt for r in full["sft"]]  # the share changes only the endings
    assert [r.prompt for r in half["train"]] == [r.prompt for r in full["train"]]
    boxed = [r for r in half["sft"] if "\\boxed" in r.answer]
    assert 150 < len(boxed) < 250
    for r in half["sft"]:
        if r not in boxed:  # the same steps, the number said in words
            assert r.answer.endswith(f"The answer is {r.meta['number']}.") and "\\boxed" not in r.answer
    with pytest.raises(ConfigError, match="sft_boxed_frac"):
        WordProblemsConfig(sft_boxed_frac=1.5).validate()


def eval_steps(solution: str) -> int:
    """The last ``x op y = z`` of a worked solution, recomputed (the generator's arithmetic is right)."""
    last = solution.split("\\boxed")[0].strip().rstrip(".").split(". ")[-1]
    left, right = last.split(" = ")
    a, op, b = left.split(" ")
    got = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    assert got == int(right)
    return got
