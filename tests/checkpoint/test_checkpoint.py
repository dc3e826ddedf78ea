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


def test_rotation_after_going_back_keeps_the_new_checkpoint_and_sets_the_abandoned_future_aside(tmp_path):
    """checkpoint.keep_last after `latest` was pointed at an older step (a rollback): the checkpoint just
    written is kept and `latest` names it; the later steps of the abandoned future are set aside, not
    counted and not deleted; older ones beyond keep_last go."""
    from pc_megatron.checkpoint import latest_checkpoint, load_latest, save_checkpoint

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(root, step, {"loop": {"step": step}}, keep_last=3)
    (root / "latest").write_text("step_000001")  # the rollback an error message may recommend
    save_checkpoint(root, 2, {"loop": {"step": 2, "again": True}}, keep_last=1)
    assert latest_checkpoint(root).name == "step_000002"
    state, _ = load_latest(root)
    assert state["loop"] == {"step": 2, "again": True}
    assert sorted(p.name for p in root.iterdir()) == ["abandoned-step_000003", "latest", "step_000002"]
    save_checkpoint(root, 3, {"loop": {"step": 3}}, keep_last=2)  # the redone step beside the set-aside one
    assert sorted(p.name for p in root.iterdir()) == ["abandoned-step_000003", "latest", "step_000002", "step_000003"]
    (root / "latest").write_text("step_000002")  # going back again: the second future is set aside too
    save_checkpoint(root, 2, {"loop": {"step": 2}}, keep_last=2)
    assert {"abandoned-step_000003", "abandoned-step_000003.2"} <= {p.name for p in root.iterdir()}
