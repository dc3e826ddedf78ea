"""The reward tests' worker functions (``tests/workers/rewards_for_tests.py``) importable by name."""

import pytest

from tests.settings import WORKERS


@pytest.fixture(autouse=True)
def _worker_modules_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(WORKERS))  # the pool hands sys.path to its workers
