"""The embedded task's policy: a character-level tokenizer and a tiny Qwen2 model, built in-process.

Both are saved in Hugging Face format, so ``transformers`` (and vLLM) load them offline like
any downloaded model.
"""

from __future__ import annotations

from pathlib import Path

from pc_megatron.model.config import TinyModelConfig

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
    """Write a randomly initialised tiny Qwen2 + tokenizer to ``out_dir`` (HF format)."""
    from transformers import Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    import torch

    torch.manual_seed(cfg.init_seed)
    model = Qwen2ForCausalLM(hf_config(cfg, tokenizer))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
