"""An HF ``config.json`` reduced to the fields the learner and the weight mapping need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pc_megatron.errors import ModelFileError

SUPPORTED_ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}


@dataclass(frozen=True)
class ArchSpec:
    family: str  # "qwen2" | "llama"
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


def _rope_theta(cfg: dict) -> float:
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", 10000.0))


def arch_from_hf_config(cfg: dict, source: str = "config.json") -> ArchSpec:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{source}: architecture {arch!r} is not supported; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling and (rope_scaling.get("rope_type") or rope_scaling.get("type")) not in (None, "default"):
        raise ModelFileError(f"{source}: rope_scaling {rope_scaling} is not supported yet")
    family = SUPPORTED_ARCHITECTURES[arch]
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
        rope_theta=_rope_theta(cfg),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )


def load_arch(model_dir: str | Path) -> ArchSpec:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{path}: model config not found; model.path must be a Hugging Face model folder")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({e.msg})") from None
    return arch_from_hf_config(cfg, str(path))
