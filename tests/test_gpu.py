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


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_forward_backward_close_to_bf16(tmp_path, recipe):
    """TE spec, bf16 vs bf16 + FP8 GEMMs (hybrid) on a random Qwen2 with FP8-friendly shapes:
    logits and gradients agree to FP8 precision."""
    pytest.importorskip("transformer_engine")
    from pc_megatron.algo import LossConfig
    from pc_megatron.model.tiny import TinyModelConfig, create_tiny_model

    folder = create_tiny_model(
        TinyModelConfig(num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512),
        tmp_path / "m",
    )
    tokens = torch.randint(2, 23, (8, 32), generator=torch.Generator().manual_seed(0)).cuda()
    batch = TokenBatch(tokens, torch.ones(8, 31))
    out = {}
    for name, fp8 in (("bf16", ""), ("fp8", "hybrid")):
        learner = Learner(
            folder, LearnerConfig(bf16=True, fp8=fp8, fp8_recipe=recipe, transformer_impl="transformer_engine"), seed=0
        )
        with torch.no_grad():
            logits = learner.forward_logits(tokens).float()
        learner.train_rl(batch, learner.logprobs(batch), torch.linspace(-1, 1, 8), LossConfig(), 1.0)
        grads = torch.cat([p.main_grad.flatten().float() for p in learner.module.parameters()])
        out[name] = (logits, grads)
    cos = torch.nn.functional.cosine_similarity
    assert cos(out["bf16"][0].flatten(), out["fp8"][0].flatten(), dim=0) > 0.99
    assert cos(out["bf16"][1], out["fp8"][1], dim=0) > 0.95
