"""``reward.name=math_verify`` (``pc_megatron/rewards/math.py``): answers graded as a mathematician would,
through the reward pool's worker processes; a parser that hangs is cut off and counted while the rest is
scored."""

from __future__ import annotations

import time

from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rewards.math import last_boxed
from pc_megatron.rewards.pool import RewardPool

PAIRS = [  # (the boxed answer a model wrote, the reference, correct?)
    # integers and signs
    ("42", "42", True),
    ("-7", "-7", True),
    ("7", "-7", False),
    ("1{,}000", "1000", True),
    ("1,000,000", "1000000", True),
    ("042", "42", True),
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
    ("\\tfrac34", "0.75", True),
    ("\\frac{2}{4}", "\\frac{1}{2}", True),
    ("1/3", "\\frac{1}{3}", True),
    ("0.333", "\\frac{1}{3}", False),
    ("\\frac{1}{3}", "\\frac{1}{4}", False),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", True),
    ("2.50", "2.5", True),
    ("25\\%", "0.25", True),
    # radicals and constants
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("3\\sqrt{3}", "\\sqrt{27}", True),
    ("2\\pi", "2\\pi", True),
    ("\\pi", "3.14", False),
    ("e^{2}", "e^2", True),
    # algebraic expressions
    ("x^2+2x+1", "(x+1)^2", True),
    ("2x+3", "3+2x", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("x^2+1", "(x+1)^2", False),
    ("\\frac{x}{2}", "0.5x", True),
    # intervals and sets
    ("[0, 1)", "[0,1)", True),
    ("(0,1)", "[0,1]", False),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}", True),
    ("\\{1,2\\}", "\\{1,2,3\\}", False),
    ("(1,2)\\cup(3,4)", "(1,2) \\cup (3,4)", True),
    # tuples / several answers
    ("(1, 2)", "(1,2)", True),
    ("(2, 1)", "(1,2)", False),
    # units and text
    ("5\\text{ cm}", "5", True),
    ("10^\\circ", "10", True),
    ("\\$12", "12", True),
    ("12 \\text{ dollars}", "12", True),
    # LaTeX spacing and formatting
    ("\\frac {1} {2}", "\\frac{1}{2}", True),
    ("\\left(1,2\\right)", "(1,2)", True),
    ("3\\,000", "3000", True),
    ("\\displaystyle \\frac{5}{6}", "\\frac{5}{6}", True),
    # equations: the value on the right
    ("x=5", "5", True),
    ("x = -3", "5", False),
    # wrong answers that look right
    ("\\frac{1}{2}", "\\frac{1}{2}+\\epsilon", False),
    ("1.4142", "\\sqrt{2}", False),
    ("10", "100", False),
    ("\\frac{22}{7}", "\\pi", False),
]
PAIRS += [  # a percent sign is a unit label or /100, whichever side carries it
    ("25", "25\\%", True),
    ("0.25", "25\\%", True),
    ("25", "0.25", False),
    ("50\\%", "0.25", False),
]


def test_answer_pairs_are_graded_as_a_mathematician_would():
    assert len(PAIRS) >= 40
    with RewardPool(RewardConfig(name="math_verify", workers=2, timeout_s=20)) as pool:
        completions = [f"We simplify step by step. The answer is $\\boxed{{{pred}}}$." for pred, _, _ in PAIRS]
        scored = pool.score(completions, [gold for _, gold, _ in PAIRS], [str(i) for i in range(len(PAIRS))])
    wrong = [(p, g, want) for (p, g, want), r in zip(PAIRS, scored.results, strict=True) if r.correct != want]
    assert not wrong, f"graded against the table: {wrong}"
    assert {r.score for r in scored.results} == {1.0, -1.0}  # the recipe's +-1
    assert all(r.score == (1.0 if r.correct else -1.0) for r in scored.results)


def test_only_the_last_boxed_answer_counts():
    assert last_boxed("first \\boxed{1}, then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("nested \\boxed{\\{1, \\{2\\}\\}} end") == "\\{1, \\{2\\}\\}"
    assert last_boxed("\\fbox{7}") == "7" and last_boxed("so \\boxed 5$.") == "5"
    assert last_boxed("no answer here") is None and last_boxed("cut \\boxed{\\frac{1}{2") is None
    with RewardPool(RewardConfig(name="math_verify", workers=1)) as pool:
        res = pool.score(
            ["the answer is 4", "\\boxed{3} no, \\boxed{4}", "\\boxed{4} no, \\boxed{3}"], ["4"] * 3, list("abc")
        )
    assert [r.correct for r in res.results] == [False, True, False]  # unboxed answers are wrong
    assert res.results[0].score == -1.0


def test_a_hanging_expression_is_cut_off_and_counted_while_the_rest_is_scored():
    completions = ["\\boxed{4}", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{5}", "\\boxed{2+2}"]
    with RewardPool(RewardConfig(name="math_verify", workers=2, timeout_s=2.0)) as pool:
        t0 = time.monotonic()
        res = pool.score(completions, ["4"] * 4, list("abcd"))
        took = time.monotonic() - t0
        again = pool.score(["\\boxed{4}"], ["4"], ["e"])  # the replaced worker serves the next call
    assert res.timeouts == 1 and res.errors == 0
    assert [r.correct for r in res.results] == [True, False, False, True]
    assert res.results[1].score == -1.0  # scored as a wrong answer (math_verify's), not silently
    assert took < 15 and again.results[0].correct
