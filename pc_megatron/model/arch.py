"""An HF ``config.json`` reduced to the fields the learner and the weight mapping need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pc_megatron.errors import ModelFileError

SUPPORTED_ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
# Megatron-Core's Llama 3 RoPE scaling hard-codes these; other values would silently differ.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class ArchSpec:
    family: str  # "qwen2" | "qwen3" | "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    tie_word_embeddings: bool
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    rope_scaling_factor: float | None = None  # Llama 3.x RoPE scaling factor; None = none


def _rope_params(cfg: dict) -> dict:
    """``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5), merged."""
    return {**(cfg.get("rope_parameters") or {}), **(cfg.get("rope_scaling") or {})}


def _rope_scaling_factor(cfg: dict, source: str) -> float | None:
    params = _rope_params(cfg)
    kind = params.get("rope_type") or params.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ModelFileError(f"{source}: rope type {kind!r} is not supported; supported: default, llama3")
    for key, fixed in LLAMA3_ROPE_FIXED.items():
        if float(params.get(key, fixed)) != fixed:
            raise ModelFileError(
                f"{source}: llama3 rope scaling with {key}={params[key]} is not supported "
                f"(Megatron-Core implements {key}={fixed})"
            )
    return float(params.get("factor", 8.0))


def _rope_theta(cfg: dict, source: str) -> float:
    theta = float(cfg.get("rope_theta", _rope_params(cfg).get("rope_theta", 10000.0)))
    if theta != int(theta):
        raise ModelFileError(f"{source}: rope_theta={theta} is not an integer (Megatron-Core takes an int base)")
    return theta


def arch_from_hf_config(cfg: dict, source: str = "config.json") -> ArchSpec:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{source}: architecture {arch!r} is not supported; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]

    def unsupported(option: str) -> ModelFileError:
        return ModelFileError(f"{source}: {arch} with {option} is not supported")

    if cfg.get("hidden_act", "silu") != "silu":
        raise unsupported(f"hidden_act={cfg['hidden_act']!r} (only silu)")
    if cfg.get("use_sliding_window"):
        raise unsupported("use_sliding_window=true")
    if family != "qwen2" and cfg.get("attention_bias"):
        raise unsupported("attention_bias=true (a bias on o_proj)")
    if cfg.get("mlp_bias"):
        raise unsupported("mlp_bias=true")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return ArchSpec(
        family=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        ffn_hidden_size=int(cfg["intermediate_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rope_theta=_rope_theta(cfg, source),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=family == "qwen2",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=family == "qwen3",
        rope_scaling_factor=_rope_scaling_factor(cfg, source),
    )


def load_arch(model_dir: str | Path) -> ArchSpec:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{path}: model config not found; model.path must be a Hugging Face model folder")
    return arch_from_file(path)


def arch_from_file(path: Path) -> ArchSpec:
    """An HF ``config.json`` (or a file of the same content) as an ``ArchSpec``."""
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({e.msg})") from None
    return arch_from_hf_config(cfg, str(path))
