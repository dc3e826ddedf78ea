"""The initial policy (``model.*``): an HF folder, a real pretrained fixture, or the embedded tiny
Qwen2."""

from __future__ import annotations

from dataclasses import dataclass, field

from pc_megatron.embedded.config import TinyModelConfig
from pc_megatron.errors import ConfigError


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
