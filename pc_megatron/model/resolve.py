"""The HF folder a run's policy starts from, before any warm-start: ``model.path``, ``model.fixture``
(converted on first use) or the embedded tiny Qwen2 (built once per config)."""

from __future__ import annotations

from pathlib import Path

from pc_megatron.data.task import config_hash
from pc_megatron.embedded.tiny_model import create_tiny_model
from pc_megatron.model.arch import load_arch
from pc_megatron.model.config import ModelConfig


def base_model_dir(model: ModelConfig, cache: Path, progress: bool = True) -> Path:
    """model.path, model.fixture (converted on first use into ``cache``), or the embedded tiny model
    (created and cached on first use)."""
    if model.path:
        load_arch(model.path)  # fails early, naming the file, if this is not a usable HF folder
        return Path(model.path)
    if model.fixture:
        from pc_megatron.model.fixtures import fixture_dir

        return fixture_dir(model.fixture, cache, progress)
    base = cache / "init" / config_hash(model.tiny)
    if not (base / "model.safetensors").is_file():
        create_tiny_model(model.tiny, base)
    return base
