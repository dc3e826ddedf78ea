"""`pc-megatron convert` (``pc_megatron/checkpoint/convert.py``): HF <-> Megatron TP/PP shards, training
checkpoint -> HF. (Training checkpoints saved at TP=2 and PP=2 are converted in
tests/learner/test_parallel.py; the name table conversion reads: tests/weight_sync/test_sharding.py.)"""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from pc_megatron.checkpoint.convert import hf_to_megatron, megatron_to_hf_folder
from pc_megatron.checkpoint.store import save_checkpoint
from pc_megatron.cli import main
from pc_megatron.errors import ModelFileError, UserError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.export import load_hf_weights
from pc_megatron.learner.learner import Learner
from pc_megatron.model.arch import load_arch


def state_dict(folder):
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return {k: v for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("tp", "pp", "last"), [(2, 1, "tp01.safetensors"), (2, 2, "tp01-pp01.safetensors")])
def test_hf_to_megatron_to_hf_round_trip_loads_in_transformers(hf_model, tmp_path, tp, pp, last):
    cmd = ["convert", "--to", "megatron", str(hf_model), str(tmp_path / "mg"), "--tp", str(tp), "--pp", str(pp)]
    assert main(cmd) == 0
    meta = json.loads((tmp_path / "mg" / "pcm_model.json").read_text())
    assert (meta["tensor_parallel_size"], meta["pipeline_parallel_size"]) == (tp, pp)
    assert len(list((tmp_path / "mg").glob("*.safetensors"))) == tp * pp and (tmp_path / "mg" / last).is_file()
    # a tiny output-file limit forces several files and an index
    megatron_to_hf_folder(tmp_path / "mg", tmp_path / "back", max_shard_gb=40e3 / 2**30)
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    for f in ("config.json", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "back" / f).is_file(), f
    original, back = load_hf_weights(hf_model), load_hf_weights(tmp_path / "back")
    tied = load_arch(hf_model).tie_word_embeddings
    assert set(back) == set(original) - ({"lm_head.weight"} if tied else set())
    for key, t in back.items():
        assert torch.equal(t, original[key]), key
    a, b = state_dict(hf_model), state_dict(tmp_path / "back")  # transformers loads it offline
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_checkpoint_to_hf(tiny_model_dir, tmp_path):
    from pc_megatron.algo.config import LossConfig
    from pc_megatron.batch import TokenBatch

    learner = Learner(tiny_model_dir, LearnerConfig(lr=1e-2), seed=0)
    tokens = torch.randint(2, 23, (2, 6), generator=torch.Generator().manual_seed(3))
    batch = TokenBatch(tokens, torch.ones(2, 5))
    learner.train_rl(batch, learner.logprobs(batch), torch.tensor([1.0, -1.0]), LossConfig(correction="none"), 1.0)
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 1, {}, keep_last=1, hf_side=tiny_model_dir, learner=learner)
    assert main(["convert", "--to", "hf", str(run), str(tmp_path / "out")]) == 0  # a run dir: latest checkpoint
    exported = load_hf_weights(tmp_path / "out")
    trained = {k: v.clone() for k, v in learner.hf_named_tensors()}
    assert set(exported) == set(trained)
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    assert not torch.equal(exported["model.norm.weight"], load_hf_weights(tiny_model_dir)["model.norm.weight"])


def test_bad_inputs_fail_clearly_and_leave_no_output(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="unreadable safetensors"):
        hf_to_megatron(broken, out)
    # config.json of another model: the weights do not fit
    (broken / "model.safetensors").write_bytes(data)
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1}))
    with pytest.raises(ModelFileError, match="lacks tensor model.layers"):
        hf_to_megatron(broken, out)
    # a shard folder missing one of its shards
    hf_to_megatron(tiny_model_dir, tmp_path / "mg")
    (tmp_path / "mg" / "tp00.safetensors").unlink()
    with pytest.raises(ModelFileError, match="shard tp00.safetensors is missing"):
        megatron_to_hf_folder(tmp_path / "mg", out)
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))
    # a training checkpoint whose learner state is damaged
    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, {}, keep_last=1, hf_side=tiny_model_dir, learner=learner)
    learner_dir = tmp_path / "run" / "checkpoints" / "step_000001" / "learner"
    for shard in learner_dir.glob("*.distcp"):  # truncated tensor data
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    with pytest.raises(ModelFileError, match="cannot read"):
        megatron_to_hf_folder(tmp_path / "run", out)
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))
    (learner_dir / ".metadata").write_bytes(b"\0" * 10)  # damaged index
    with pytest.raises(ModelFileError, match="unreadable distributed checkpoint"):
        megatron_to_hf_folder(tmp_path / "run", out)
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))
    with pytest.raises(UserError, match="already exists"):
        hf_to_megatron(tiny_model_dir, tmp_path / "mg")
    # TP that does not divide the model, through the CLI: one line, exit code 2
    assert main(["convert", "--to", "megatron", str(tiny_model_dir), str(out), "--tp", "3"]) == 2
    assert "does not divide" in capsys.readouterr().err and not out.exists()
