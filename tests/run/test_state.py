"""What a checkpoint saves and a resume restores (``pc_megatron/run/state.py``): a state from another
version is one line, not a traceback."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pc_megatron.checkpoint.store import save_checkpoint
from pc_megatron.errors import ModelFileError
from pc_megatron.run.state import LoopState, RunState


def test_a_state_file_from_a_newer_version_is_one_line(tmp_path):
    loop = asdict(LoopState(step=3)) | {"tokens_seen": 12345}  # a field a later version added
    save_checkpoint(tmp_path / "checkpoints", 3, {"scheduler": {}, "loop": loop, "fingerprint": None}, keep_last=1)
    with pytest.raises(ModelFileError, match=r"state.pt: written by another version.*tokens_seen"):
        RunState(tmp_path, fingerprint={}, resume=True)
    save_checkpoint(tmp_path / "checkpoints", 4, {"scheduler": {}, "loop": asdict(LoopState(step=4))}, keep_last=1)
    assert RunState(tmp_path, fingerprint={}, resume=True).resume_step == 4  # today's own state loads
