"""``reward.name=math_verify``: the final ``\\boxed{...}`` answer of a completion against the
reference, compared as mathematics by the ``math-verify`` package (LaTeX and plain expressions,
fractions, radicals, intervals, sets, units, spacing), +1 when equal and -1 otherwise (the
recipe's score; ``correct`` is the flag accuracy counts).

Only the last boxed answer counts, as in the recipe: a completion without one is wrong, so the
policy learns to state its answer. math-verify's own timeouts are switched off (they rely on
``signal.alarm``, which works only on a process's main thread, and a timeout there would silently
score as wrong); the reward pool's per-item deadline cuts a hanging comparison off instead and
counts it (``reward/timeouts``).
"""

from __future__ import annotations

import logging
import re

from pc_megatron.rewards.result import RewardResult

_BOX = ("\\boxed", "\\fbox")
_DIGIT_GAP = re.compile(r"(?<=\d)(?:\\,|\\!|\\ |~|\\thinspace)(?=\d)")  # 3\,000: a thousands gap
_PERCENT = re.compile(r"\\?%")


def _variants(text: str) -> list[str]:
    """The ways to read an answer: a digit-group gap removed; a percent sign as a unit label
    (25% -> 25) or as /100 (25% -> 25/100)."""
    text = _DIGIT_GAP.sub("", text)
    if not _PERCENT.search(text):
        return [text]
    bare = _PERCENT.sub("", text).strip()
    return [bare, f"({bare})/100"]


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in
    ``text``, braces balanced; None when there is none or it never closes."""
    start = max(text.rfind(b) for b in _BOX)
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i):  # \boxed 5: one token after a space
        rest = text[i + 1 :].split("$")[0].split()
        return rest[0] if rest else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


class MathVerifyReward:
    """+1 / -1 by math-verify equivalence of the last boxed answer to the reference."""

    correct_score, incorrect_score = 1.0, -1.0

    def __init__(self) -> None:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" on every call
        self._parse, self._verify = parse, verify
        self._targets = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

    def _exprs(self, text: str) -> list:
        out = []
        for v in _variants(text):
            out += self._parse(f"\\boxed{{{v}}}", self._targets, parsing_timeout=None)
        return out

    def __call__(self, completion: str, answer: str) -> RewardResult:
        boxed = last_boxed(completion)
        if boxed is None or not boxed.strip():
            return RewardResult(self.incorrect_score, False)
        gold, pred = self._exprs(answer), self._exprs(boxed)
        ok = bool(gold) and bool(pred) and self._verify(gold, pred, timeout_seconds=None)
        return RewardResult(self.correct_score if ok else self.incorrect_score, ok)
