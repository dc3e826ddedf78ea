"""The learner's checkpoint (``pc_megatron/learner/checkpoint_io.py``): the step after a save and load is the
step the original learner takes; another model's checkpoint, a damaged one, and one of another optimizer
layout are refused with nothing changed."""

import pytest
import torch

from pc_megatron.batch import TokenBatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner


def _results(stats: dict) -> dict:
    """A step's results without its timings (``time_*``: measurements, not state)."""
    return {k: v for k, v in stats.items() if not k.startswith("time_")}


def test_checkpoint_from_a_different_model_is_rejected(tiny_model_dir, tmp_path):
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.errors import ModelFileError

    other_dir = create_tiny_model(
        TinyModelConfig(num_layers=3, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256),
        tmp_path / "three",
    )
    Learner(other_dir, LearnerConfig(), seed=0).save(tmp_path / "ckpt")
    learner = Learner(tiny_model_dir, LearnerConfig(), seed=0)
    before = {n: p.detach().clone() for n, p in learner.module.named_parameters()}
    with pytest.raises(ModelFileError, match="different model.*num_layers"):
        learner.load(tmp_path / "ckpt")
    for n, p in learner.module.named_parameters():
        assert torch.equal(p, before[n])
    learner.save(tmp_path / "mine")
    for shard in (tmp_path / "mine").glob("*.distcp"):  # truncated: one clear error
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    with pytest.raises(ModelFileError, match="cannot load the learner checkpoint.*earlier checkpoint"):
        learner.load(tmp_path / "mine")


@pytest.mark.parametrize(
    ("distributed_optimizer", "bf16"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_saved_learner_resumes_exactly(tiny_model_dir, tmp_path, distributed_optimizer, bf16):
    """Model, Adam moments, Adam step counts and lr schedule come back (with bf16: the fp32 main
    parameters too): the step after a save/load equals the step the original learner takes."""
    from pc_megatron.algo.config import LossConfig

    cfg = LearnerConfig(lr_warmup_steps=3, distributed_optimizer=distributed_optimizer, bf16=bf16)
    tokens = torch.randint(2, 23, (3, 7), generator=torch.Generator().manual_seed(5))
    batch = TokenBatch(tokens, torch.ones(3, 6))
    adv = torch.tensor([1.0, -0.5, 0.3])
    first = Learner(tiny_model_dir, cfg, seed=0)
    first.train_rl(batch, first.logprobs(batch), adv, LossConfig(correction="none"), 1.0)
    first.save(tmp_path / "ckpt")
    second = Learner(tiny_model_dir, cfg, seed=1)
    second.load(tmp_path / "ckpt")
    assert second.version == 1
    weights_only = Learner(tiny_model_dir, cfg, seed=1)  # the control: same weights, fresh optimizer
    with torch.no_grad():
        for p, q in zip(weights_only.module.parameters(), second.module.parameters(), strict=True):
            p.copy_(q)
    for lrn in (first, second, weights_only):
        old = lrn.logprobs(batch)
        lrn.stats = _results(lrn.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0))
    assert first.stats == second.stats
    for (n, a), (_, b) in zip(first.module.named_parameters(), second.module.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    gap = max(
        (a - b).abs().max() for a, b in zip(first.module.parameters(), weights_only.module.parameters(), strict=True)
    )
    assert gap > 1e-5 if not bf16 else gap > 0  # without the saved Adam moments and lr schedule the step differs


def test_checkpoint_with_another_optimizer_layout_is_refused(tiny_model_dir, tmp_path):
    """A plain-optimizer checkpoint does not load into a distributed-optimizer run: one error
    naming the setting, nothing changed."""
    from pc_megatron.errors import ModelFileError

    Learner(tiny_model_dir, LearnerConfig(), seed=0).save(tmp_path / "ckpt")
    learner = Learner(tiny_model_dir, LearnerConfig(distributed_optimizer=True), seed=0)
    with pytest.raises(ModelFileError, match="learner.distributed_optimizer=false, this run uses true"):
        learner.load(tmp_path / "ckpt")
    assert learner.version == 0
