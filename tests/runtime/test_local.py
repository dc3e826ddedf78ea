"""The local runtime (``pc_megatron/runtime/local.py``): the engine's calls on a thread of their own, each
waited for at most rollout.timeout_s, so a hung engine fails the run naming the call."""

from __future__ import annotations

import time

import pytest

from pc_megatron.config import load_config
from pc_megatron.errors import TrainingError
from pc_megatron.train import train
from tests.settings import SMALL, hang_generate_at


def test_a_hung_engine_in_the_synchronous_loop_fails_the_run_within_its_deadline(cache_dir, tmp_path, monkeypatch):
    """η = 0 under runtime=local: the generate call runs on the engine's own thread and the loop waits
    for it at most rollout.timeout_s; the error names the call, and the last checkpoint stays."""
    hang_generate_at(monkeypatch, 3)  # step 0's evaluation, step 1, then step 2's batch hangs
    cfg = load_config(
        "tiny", [*SMALL, "checkpoint.every_steps=1", "steps=4", "rollout.timeout_s=8", "eval.every_steps=10"]
    )
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=r"the engine's generate call did not answer within rollout.timeout_s=8 s"):
        train(cfg, tmp_path / "hung")
    assert time.monotonic() - t0 < 90
    assert (tmp_path / "hung" / "checkpoints" / "latest").read_text() == "step_000001"
