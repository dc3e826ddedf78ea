"""The learner's optimizer state and gradient buffers offloaded to pinned host memory between steps
(``pc_megatron/learner/offload.py``; marked ``gpu``, skipped on CPU)."""

import pytest
import torch

from pc_megatron.batch import TokenBatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner


@pytest.mark.gpu
def test_offload_to_pinned_host_memory_frees_the_gpu_and_changes_nothing(tiny_model_dir):
    """Two bf16 learners take the same steps; one offloads its optimizer state (to pinned host
    buffers) and gradient buffers between steps. Device memory goes down while offloaded, and the
    weights after three steps are bit-identical to the learner that never offloaded."""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (8, 12), generator=torch.Generator().manual_seed(1)).cuda()
    batch = TokenBatch(tokens, torch.ones(8, 11, device="cuda"))
    adv = torch.linspace(-1, 1, 8, device="cuda")
    weights = {}
    for offload in (False, True):
        learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3, offload_during_rollout=offload), seed=0)
        for _ in range(3):
            learner.train_rl(batch, learner.logprobs(batch), adv, LossConfig(correction="none"), 1.0)
            used = torch.cuda.memory_allocated()
            learner.offload()
            if offload:
                assert torch.cuda.memory_allocated() < used and learner._host.host_bytes > 0
        weights[offload] = {n: t.clone() for n, t in learner.hf_named_tensors()}
    for name, t in weights[False].items():
        assert torch.equal(t, weights[True][name]), name


@pytest.mark.gpu
def test_a_checkpoint_offloads_the_state_again_before_the_next_rollout(tiny_model_dir, tmp_path):
    """learner.offload_during_rollout: ``save`` brings the optimizer state back to write it, then sends it
    to host memory again (the next rollout's KV cache wakes into that room); the saved state loads back."""
    from pc_megatron.algo.config import LossConfig

    tokens = torch.randint(2, 23, (8, 12), generator=torch.Generator().manual_seed(1)).cuda()
    batch = TokenBatch(tokens, torch.ones(8, 11, device="cuda"))
    learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3, offload_during_rollout=True), seed=0)
    learner.train_rl(batch, learner.logprobs(batch), torch.linspace(-1, 1, 8, device="cuda"), LossConfig(), 1.0)
    learner.offload()
    offloaded = torch.cuda.memory_allocated()
    learner.save(tmp_path / "ckpt")
    assert learner._offloaded and torch.cuda.memory_allocated() <= offloaded
    twin = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3, offload_during_rollout=True), seed=0)
    twin.load(tmp_path / "ckpt")
    assert twin.version == learner.version == 1
