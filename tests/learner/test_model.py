"""The Megatron model of each family (``pc_megatron/learner/model.py``) against transformers: Qwen2 (qkv
bias, tied embeddings), Qwen3 (q/k norm, head_dim != hidden/heads) and Llama 3 (RoPE scaling, untied
embeddings), all with GQA; FP8 refused without a GPU."""

import json
import shutil

import pytest
import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.export import load_hf_weights
from pc_megatron.learner.learner import Learner
from pc_megatron.model.arch import load_arch
from tests.hf_models import CONFIGS, make_hf_model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, make_hf_model(request.param, folder)


def compare_logits(learner, hf_model):
    tokens = torch.randint(0, 96, (3, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = learner.forward_logits(tokens).float()
        ref = hf_model(input_ids=tokens).logits.float()
    logp, logq = torch.log_softmax(ref, -1), torch.log_softmax(ours, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean()
    return float((ours - ref).abs().max()), float(kl)


def test_logits_match_transformers(family):
    name, folder, hf_model = family
    diff, kl = compare_logits(Learner(folder, LearnerConfig(), seed=0), hf_model)
    assert diff < 1e-4 and kl < 1e-6, (name, diff, kl)


def test_hf_to_megatron_to_hf_is_bit_identical(family):
    _, folder, _ = family
    original = load_hf_weights(folder)
    exported = dict(Learner(folder, LearnerConfig(), seed=0).hf_named_tensors())
    assert set(exported) == set(original) - ({"lm_head.weight"} if load_arch(folder).tie_word_embeddings else set())
    for key, t in exported.items():
        assert torch.equal(t, original[key]), key


def test_negative_controls_break_parity(family, tmp_path, monkeypatch):
    """The parity check bites on what each family adds: Qwen3 with q_norm and k_norm swapped,
    Llama 3 without its RoPE scaling, Qwen2 without its qkv bias."""
    name, folder, hf_model = family
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    if name == "qwen3":
        from pc_megatron.weight_sync import mapping

        simple = dict(mapping._LAYER_SIMPLE)
        simple["self_attention.q_layernorm.weight"], simple["self_attention.k_layernorm.weight"] = (
            simple["self_attention.k_layernorm.weight"],
            simple["self_attention.q_layernorm.weight"],
        )
        monkeypatch.setattr(mapping, "_LAYER_SIMPLE", simple)
    elif name == "llama3":
        cfg = json.loads((bad / "config.json").read_text())
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        (bad / "config.json").write_text(json.dumps(cfg))
    else:
        from pc_megatron.model import arch as arch_mod

        real = arch_mod.arch_from_hf_config
        monkeypatch.setattr(
            "pc_megatron.learner.learner.load_arch",
            lambda d: __import__("dataclasses").replace(
                real(json.loads((d / "config.json").read_text())), qkv_bias=False
            ),
        )
    try:
        diff, kl = compare_logits(Learner(bad, LearnerConfig(), seed=0), hf_model)
    except ModelFileError:
        return  # refusing the model also counts
    assert diff > 1e-3, (name, diff, kl)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_fp8_without_a_gpu_is_one_clear_error(tiny_model_dir):
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="learner.fp8 needs a CUDA GPU with Transformer Engine"):
        Learner(tiny_model_dir, LearnerConfig(bf16=True, fp8="hybrid"), seed=0)


def test_fp8_scaling_stays_within_tensor_parallel_ranks_and_the_fusions_follow_the_te_spec_on_cuda(tiny_model_dir):
    import importlib.util

    if torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("an FP8 TransformerConfig on CUDA needs Transformer Engine, which this image lacks")
    """Data-parallel ranks get different micro-batch counts from the token-budget planner; with FP8's
    amax reduced over data-parallel ranks too, a rank done early would wait in the gradient reduction
    while the others wait in an amax reduction. The amax stays within the tensor-parallel group (which
    shares one plan). Megatron's fused RoPE/SwiGLU/bias-dropout kernels: TE spec on CUDA only."""
    from types import SimpleNamespace

    from pc_megatron.learner.microbatch import plan_micro_batches
    from pc_megatron.learner.model import transformer_config

    counts = {len(r) for r in plan_micro_batches([64, 900, 70, 2000, 64, 80, 3000, 90], 4, max_tokens=2048).ranks}
    assert len(counts) > 1  # what makes a cross-DP reduction per micro-batch unsafe
    arch, layout = load_arch(tiny_model_dir), SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1)
    fp8 = transformer_config(arch, layout, bf16=True, fp8="hybrid", te=True)
    assert fp8.tp_only_amax_red
    assert not transformer_config(arch, layout, bf16=True).tp_only_amax_red
    fused = torch.cuda.is_available()  # on CPU the TE spec never runs; the fusions are CUDA kernels
    assert (fp8.apply_rope_fusion, fp8.bias_activation_fusion, fp8.bias_dropout_fusion) == (fused,) * 3
    local = transformer_config(arch, layout, bf16=False, te=False)
    assert not (local.apply_rope_fusion or local.bias_activation_fusion or local.bias_dropout_fusion)
