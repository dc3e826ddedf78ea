"""Training-state checkpoints (``pc_megatron/checkpoint/__init__.py``): a damaged state file is one clear
error."""

import pytest
import torch

from pc_megatron.errors import ModelFileError


def test_a_damaged_state_file_gets_the_same_clear_message_as_a_damaged_shard(tmp_path):
    from pc_megatron.checkpoint import load_latest

    step = tmp_path / "step_000002"
    step.mkdir()
    torch.save({"loop": {"step": 2}}, step / "state.pt")
    (tmp_path / "latest").write_text("step_000002")
    data = (step / "state.pt").read_bytes()
    (step / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match=r"state.pt: cannot read .* damaged or incomplete.*checkpoints/latest"):
        load_latest(tmp_path)
