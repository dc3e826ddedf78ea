"""Random Hugging Face models of each supported family, all with GQA: Qwen2 (qkv bias, tied
embeddings), Qwen3 (q/k norm, head_dim != hidden/heads) and Llama 3 (RoPE scaling, untied
embeddings)."""

from __future__ import annotations

import torch

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16384,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 10000.0,
}


def _config(kind: str, **kw):
    import transformers  # here, not at the top: tests/conftest.py reads CONFIGS' names at every start

    return getattr(transformers, kind)(**COMMON, **kw)


CONFIGS = {
    "qwen2-tied": lambda: _config("Qwen2Config", tie_word_embeddings=True),
    "qwen3": lambda: _config("Qwen3Config", head_dim=32, tie_word_embeddings=False),
    "llama3": lambda: _config("LlamaConfig", rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
}


def make_hf_model(name, folder):
    """A random model with weights large enough that every component moves the logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.15)
    model.save_pretrained(folder)
    return model.eval()
