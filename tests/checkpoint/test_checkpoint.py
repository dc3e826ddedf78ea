"""Training-state checkpoints (``pc_megatron/checkpoint/store.py``): a damaged state file is one clear
error."""

import pytest
import torch

from pc_megatron.errors import ModelFileError


def test_a_damaged_state_file_gets_the_same_clear_message_as_a_damaged_shard(tmp_path):
    from pc_megatron.run.state import load_latest

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
    from pc_megatron.checkpoint.store import latest_checkpoint, save_checkpoint
    from pc_megatron.run.state import load_latest

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


class _WritesAFile:
    """Unpickling this calls ``Path.write_text``: what a crafted checkpoint can do under pickle."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        from pathlib import Path

        return (Path.write_text, (Path(self.target), "ran"))


def test_a_crafted_state_file_whose_unpickling_runs_code_is_refused_and_runs_nothing(tmp_path):
    from pc_megatron.run.state import load_latest

    target = tmp_path / "written-by-the-checkpoint"
    step = tmp_path / "step_000002"
    step.mkdir()
    torch.save({"loop": {"step": 2}, "scheduler": _WritesAFile(target)}, step / "state.pt")
    (tmp_path / "latest").write_text("step_000002")
    with pytest.raises(ModelFileError, match=r"state.pt: holds Python objects that loading would run as code"):
        load_latest(tmp_path)
    assert not target.exists()


def test_the_replay_buffer_and_rng_states_come_back_from_plain_data(tmp_path):
    """A Pilot-Commit buffer holds engine completions with their behaviour (log-probs, versions, spans):
    written as plain data, read back with weights_only, equal to what was saved."""
    import numpy as np

    from pc_megatron.batch import Completion
    from pc_megatron.checkpoint.store import save_checkpoint
    from pc_megatron.run.state import load_latest
    from pc_megatron.scheduler.types import Sample

    completion = Completion(7, [5, 6, 2], [-0.5, -1.25, -0.125], "stop", 3, [(0, 2), (2, 3)])
    buffer = [(7, [Sample(True, 1.0, 3, completion, 3), Sample(False, 0.0, 2, None, 4)], 5, 1)]
    state = {
        "scheduler": {"buffer": buffer, "state": {0: "active", 7: "deferred"}, "prior": [0.5, np.float64(0.25)]},
        "loop": {"step": 9},
    }
    np.random.seed(3)
    save_checkpoint(tmp_path, 9, state, keep_last=1)
    expected_draw = np.random.rand()
    back, _ = load_latest(tmp_path)
    assert back["scheduler"]["buffer"] == buffer
    assert back["scheduler"]["buffer"][0][1][0].payload.version_spans == [(0, 2), (2, 3)]
    assert back["scheduler"]["prior"] == [0.5, 0.25] and back["scheduler"]["state"] == state["scheduler"]["state"]
    from pc_megatron.checkpoint.store import set_rng_state

    set_rng_state(back["rng"])
    assert np.random.rand() == expected_draw


def test_a_checkpoint_of_the_earlier_pickled_format_still_resumes_as_data(tmp_path):
    """Before the state was plain data, state.pt pickled the buffer's Sample and Completion objects
    (Completion then in rollout/base.py) and NumPy's RNG arrays: loaded with weights_only and only those
    classes allowed, it reads as it did."""
    import numpy as np

    from pc_megatron.batch import Completion
    from pc_megatron.run.state import load_latest
    from pc_megatron.scheduler.types import Sample

    Completion.__module__ = "pc_megatron.rollout.base"  # pickled under the name the earlier version gave it
    try:
        buffer = [(3, [Sample(True, 1.0, 2, Completion(3, [4, 5], [-0.5, -0.25], "stop", 2), 2)], 4, 1)]
        state = {"scheduler": {"buffer": buffer}, "loop": {"step": 4}, "rng": {"numpy": np.random.get_state()}}
        (tmp_path / "step_000004").mkdir()
        torch.save(state, tmp_path / "step_000004" / "state.pt")
    finally:
        Completion.__module__ = "pc_megatron.batch"
    (tmp_path / "latest").write_text("step_000004")
    back, _ = load_latest(tmp_path)
    assert back["scheduler"]["buffer"] == buffer and back["rng"]["numpy"][1].dtype == np.uint32


def test_rotation_orders_steps_as_numbers_past_six_digits(tmp_path):
    """``step_1000000`` sorts after ``step_999999`` (by name it sorts before it, and rotation deleted the
    newest checkpoint)."""
    from pc_megatron.checkpoint.store import latest_checkpoint, save_checkpoint

    root = tmp_path / "checkpoints"
    for step in (999_998, 999_999, 1_000_000):
        save_checkpoint(root, step, {"loop": {"step": step}}, keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_1000000", "step_999999"]
    assert latest_checkpoint(root).name == "step_1000000"
