"""Megatron-Core's checkpoint writer (``pc_megatron/compat/checkpoint_writer.py``): its helper process dies
with a run that is killed, where Megatron-Core's own outlives it."""

import os
import signal

from tests.process_checks import sigkill_and_survivors
from tests.settings import WORKERS


def _writer_helpers(tiny_model_dir, tmp_path, *flags) -> list[int]:
    worker = [str(WORKERS / "checkpoint_writer_worker.py"), str(tiny_model_dir), str(tmp_path / "ckpt"), *flags]
    helpers, left = sigkill_and_survivors(worker, wait_s=10)
    assert helpers
    return left


def test_the_checkpoint_writers_helper_dies_with_a_killed_run(tiny_model_dir, tmp_path):
    """Megatron-Core's writer starts a spawn-context manager process on the first save; the learner's
    replacement asks the kernel to kill it with its parent."""
    assert _writer_helpers(tiny_model_dir, tmp_path) == []


def test_negative_control_megatrons_own_writer_helper_outlives_a_killed_run(tiny_model_dir, tmp_path):
    left = _writer_helpers(tiny_model_dir, tmp_path, "--megatron-own-queue")
    for pid in left:  # clean up what the control proves is left behind
        os.kill(pid, signal.SIGKILL)
    assert left, "Megatron's own helper died too: the test above could not fail"
