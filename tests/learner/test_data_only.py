"""A learner checkpoint is read as data, all of it (``pc_megatron/learner/data_only.py``): a ``.metadata``
or a ``common.pt`` whose unpickling would run code is refused in one line naming the file, on
``--resume`` (``Learner.load``) and on ``convert --to hf``, and the code never runs."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner


class _Opens:
    """Unpickled, it creates ``path``: what a crafted checkpoint would do instead of building data."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def saved(tiny_model_dir, tmp_path):
    """A learner, its checkpoint, and the HF folder it started from."""
    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    learner.save(tmp_path / "good")
    return learner, tmp_path / "good", tiny_model_dir


@pytest.mark.parametrize("target", [".metadata", "common.pt"])
def test_a_checkpoint_file_that_would_run_code_is_refused_before_it_is_read(saved, tmp_path, target, capsys):
    from pc_megatron.checkpoint.store import save_checkpoint
    from pc_megatron.cli import main

    learner, good, model_dir = saved
    bad, marker = tmp_path / "bad", tmp_path / "ran"
    shutil.copytree(good, bad)
    if target == ".metadata":
        (bad / target).write_bytes(pickle.dumps(_Opens(str(marker))))
    else:
        torch.save({"optimizer": _Opens(str(marker))}, bad / target)
    with pytest.raises(ModelFileError, match=rf"{target}.*would run as code.*do not load it"):
        learner.load(bad)
    assert not marker.exists()
    run = tmp_path / "run"  # the same folder as a run's checkpoint, converted
    save_checkpoint(run / "checkpoints", 1, {}, keep_last=1, hf_side=model_dir, learner=learner)
    step = run / "checkpoints" / "step_000001" / "learner"
    shutil.rmtree(step)
    shutil.copytree(bad, step)
    assert main(["convert", "--to", "hf", str(run), str(tmp_path / "out")]) != 0
    assert "would run as code" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out").exists()
