"""GPU paths (marked ``gpu``; skipped on CPU): Transformer Engine layer spec and the CUDA engine.

Run on a GPU machine with ``pytest -m gpu``. Not yet run: no GPU was available when written.
"""

import pytest
import torch

from pc_megatron.learner import Learner, LearnerConfig, TokenBatch
from pc_megatron.rollout.base import SamplingParams
from pc_megatron.rollout.batch import completions_to_batch
from pc_megatron.rollout.hf_engine import HFEngine

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
def test_learner_on_gpu_matches_the_engine(tiny_model_dir, impl):
    if impl == "transformer_engine":
        pytest.importorskip("transformer_engine")
    learner = Learner(tiny_model_dir, LearnerConfig(transformer_impl=impl), seed=0)
    engine = HFEngine(tiny_model_dir)
    engine.update_weights(learner.hf_named_tensors())
    prompts = [[3, 4, 12, 5, 16], [7, 16]]
    completions = engine.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=6), seed=0)
    batch, engine_logp = completions_to_batch(prompts, completions, pad_id=0)
    mismatch = (learner.logprobs(batch) - engine_logp).abs() * batch.loss_mask
    assert float(mismatch.max()) < 1e-3  # TF32/cuBLAS reductions differ from CPU fp32


def test_bf16_learner_step_on_gpu(tiny_model_dir):
    learner = Learner(tiny_model_dir, LearnerConfig(bf16=True, lr=1e-3), seed=0)
    tokens = torch.randint(2, 23, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(tokens, torch.ones(4, 7))
    first = learner.train_sft(batch)["loss"]
    for _ in range(5):
        last = learner.train_sft(batch)["loss"]
    assert last < first
