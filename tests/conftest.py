"""Shared fixtures. Every test here runs on CPU; GPU tests carry the ``gpu`` marker and skip."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU tensors in the interpreter
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One cache for the session, so the tiny model and task are built once."""
    path = tmp_path_factory.mktemp("pcm-cache")
    os.environ["PC_MEGATRON_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from pc_megatron.embedded.tiny_model import create_tiny_model
    from pc_megatron.model.config import TinyModelConfig

    cfg = TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
    return create_tiny_model(cfg, tmp_path_factory.mktemp("tiny") / "model")
