"""User reward functions for tests (``reward.function=rewards_for_tests:...`` with this folder on
the path): ordinary answers, and inputs on which the reward hangs, crashes or raises."""

import os
import time


def exact(completion: str, answer: str) -> bool:
    if completion == "hang":
        time.sleep(600)
    if completion == "crash":
        os._exit(3)
    if completion == "raise":
        raise ValueError("cannot parse")
    return completion.strip() == answer


def scored(completion: str, answer: str) -> float:
    return 1.0 if completion == answer else -1.0


def always_hangs(completion: str, answer: str) -> bool:
    time.sleep(600)
    return False


def fails_on_some_answers(completion: str, answer: str) -> bool:
    """Hangs on references ending in 3, raises on those ending in 7, else exact: a reward that fails on
    known prompts whatever the policy writes."""
    if answer.endswith("3"):
        time.sleep(600)
    if answer.endswith("7"):
        raise ValueError("cannot parse")
    return completion.strip() == answer
