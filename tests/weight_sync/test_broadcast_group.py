"""The broadcast group (``pc_megatron/weight_sync/broadcast_group.py``) over gloo: a receiver that never joins
is one clear error at the deadline, and the one that joined is not left waiting."""

from __future__ import annotations

import queue
import time

import pytest
import torch.multiprocessing as mp

from pc_megatron.errors import TrainingError
from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
from tests.weight_sync.broadcast_receivers import ReceiverEngine


def test_a_receiver_that_never_joins_is_one_clear_error_at_the_deadline(tmp_path):
    ctx = mp.get_context("spawn")
    engine = ReceiverEngine(ctx, tmp_path / "engine.pt")
    try:
        group = BroadcastGroup.create("127.0.0.1", receivers=2, timeout_s=3)
        engine.start_join(group.info, 1)  # rank 2 never comes
        t0 = time.monotonic()
        with pytest.raises(TrainingError, match=r"engine replica 1 did not join the group within 3 s"):
            group.connect(names=["engine replica 0", "engine replica 1"])
        assert time.monotonic() - t0 < 10
        assert not group.alive
        # the receiver that came is not left waiting for the group either
        with pytest.raises(RuntimeError):
            engine.answer(timeout=60)
    except queue.Empty:
        pytest.fail("the receiver that joined kept waiting for the group that never formed")
    finally:
        engine.stop()
