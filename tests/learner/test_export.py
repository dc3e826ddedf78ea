"""HF weights in and out of the learner (``pc_megatron/learner/export.py``): another model's weights refused,
missing, truncated or mis-indexed files named, and the learner's parameters checked against the name
table at start."""

import json
import shutil

import pytest

from pc_megatron.checkpoint.convert import megatron_param_names
from pc_megatron.errors import ModelFileError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.export import load_hf_weights
from pc_megatron.learner.learner import Learner


def test_weights_from_a_different_model_are_rejected(tmp_path, learner):
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model

    other = create_tiny_model(
        TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=384),
        tmp_path / "other",
    )
    with pytest.raises(ModelFileError, match="expects"):
        learner.weights.load_hf(other)


def test_missing_and_truncated_weight_files_give_clear_errors(tmp_path, tiny_model_dir):

    from pc_megatron.errors import ModelFileError

    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="unreadable safetensors"):
        load_hf_weights(broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelFileError, match="no \\*.safetensors"):
        load_hf_weights(broken)
    with pytest.raises(ModelFileError, match="config.json"):
        Learner(tmp_path / "nowhere", LearnerConfig(), seed=0)


def test_learner_load_errors_name_the_file(tmp_path, tiny_model_dir):
    """The learner reads HF weights lazily (safetensors slices): a truncated file, and an index
    that names a shard the folder lacks, each fail with one clear error naming the file."""
    import shutil

    from pc_megatron.errors import ModelFileError

    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="model.safetensors: unreadable safetensors"):
        Learner(broken, LearnerConfig(), seed=0)
    (broken / "model.safetensors").write_bytes(data)
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="names shard model-00002-of-00002.safetensors, which is not in"):
        Learner(broken, LearnerConfig(), seed=0)


def test_a_name_table_that_disagrees_with_the_model_is_one_clear_error(hf_model, monkeypatch):
    """The learner checks its parameters against the table at start (a wrong table would hang
    the other pipeline stages during weight export)."""
    import pc_megatron.learner.export as export_mod

    te_table = lambda arch, impl: megatron_param_names(arch, "transformer_engine")  # noqa: E731
    monkeypatch.setattr(export_mod, "megatron_param_names", te_table)
    with pytest.raises(ModelFileError, match=r"local layer spec: parameter decoder.layers.0.*name table"):
        Learner(hf_model, LearnerConfig(transformer_impl="local"), seed=0)
