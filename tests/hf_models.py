"""Random Hugging Face models of each supported family, all with GQA: Qwen2 (qkv bias, tied
embeddings), Qwen3 (q/k norm, head_dim != hidden/heads) and Llama 3 (RoPE scaling, untied
embeddings)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

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
CONFIGS = {
    "qwen2-tied": lambda: Qwen2Config(**COMMON, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False),
    "llama3": lambda: LlamaConfig(**COMMON, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
}


def make_hf_model(name, folder):
    """A random model with weights large enough that every component moves the logits."""
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
