"""The embedded task's policy: a character-level tokenizer and a tiny Qwen2 model, built in-process.

Both are saved in Hugging Face format, so ``transformers`` (and vLLM) load them offline like
any downloaded model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pc_megatron.embedded.config import TinyModelConfig

PAD, EOS = "<|pad|>", "<|endoftext|>"
CHARS = "0123456789+-*/=()?., "


def build_tokenizer():
    """Character-level fast tokenizer: one token per character, ``<|endoftext|>`` as EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1} | {c: i + 2 for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)


def hf_config(cfg: TinyModelConfig, tokenizer):
    from transformers import Qwen2Config

    if cfg.hidden_size % 64 or cfg.hidden_size // 64 != cfg.num_heads:
        from pc_megatron.errors import ConfigError

        raise ConfigError(
            f"model.tiny: hidden_size {cfg.hidden_size} with {cfg.num_heads} heads gives head_dim "
            f"{cfg.hidden_size / cfg.num_heads:g}; set num_heads = hidden_size / 64"
        )
    return Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )


def create_tiny_model(cfg: TinyModelConfig, out_dir: str | Path) -> Path:
    """Write a randomly initialised tiny Qwen2 + tokenizer to ``out_dir`` (HF format): into a folder of
    this process's own, renamed when complete, so that two runs filling one cache at once never read
    a half-written folder (the same seed gives the same model: the first one in is kept)."""
    import torch
    from transformers import Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = build_tokenizer()
    torch.manual_seed(cfg.init_seed)
    model = Qwen2ForCausalLM(hf_config(cfg, tokenizer))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if (out_dir / "model.safetensors").is_file():  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
        return out_dir
    shutil.rmtree(out_dir, ignore_errors=True)  # a folder a killed run left half-written
    os.replace(tmp, out_dir)
    return out_dir
