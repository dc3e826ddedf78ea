"""The HF folder a run's policy starts from, before any warm-start: ``model.path``, ``model.fixture``
(converted on first use) or the embedded tiny Qwen2 (built once per config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pc_megatron.data.task import cache_root, config_hash
from pc_megatron.model.arch import load_arch
from pc_megatron.model.tiny import create_tiny_model


def base_model_dir(cfg: Any) -> Path:
    """model.path, model.fixture (converted on first use), or the embedded tiny model (created and
    cached on first use)."""
    if cfg.model.path:
        load_arch(cfg.model.path)  # fails early, naming the file, if this is not a usable HF folder
        return Path(cfg.model.path)
    if cfg.model.fixture:
        from pc_megatron.model.fixtures import fixture_dir

        return fixture_dir(cfg.model.fixture, cache_root(cfg.warmstart.cache_dir), cfg.progress)
    base = cache_root(cfg.warmstart.cache_dir) / "init" / config_hash(cfg.model.tiny)
    if not (base / "model.safetensors").is_file():
        create_tiny_model(OmegaConf.to_object(cfg.model.tiny), base)
    return base
