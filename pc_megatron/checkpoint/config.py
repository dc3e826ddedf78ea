"""``checkpoint.*``: when training-state checkpoints are written and how many are kept."""

from __future__ import annotations

from dataclasses import dataclass

from pc_megatron.errors import ConfigError


@dataclass
class CheckpointConfig:
    """Training-state checkpoints."""

    every_steps: int = 25
    """Save every this many RL steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    save_hf: bool = False
    """Also write a Hugging Face folder with each checkpoint (``step_N/huggingface/``: sharded
    safetensors, config, tokenizer), loadable by transformers and vLLM as it is; it goes with its
    checkpoint when rotation prunes it. (``pc-megatron convert --to hf`` makes one afterwards.)"""
    on_signal: bool = True
    """On SIGTERM or SIGUSR1 (a scheduler preempting the job), finish the step and save a checkpoint
    before stopping (false: stop after the step without one)."""

    def validate(self) -> None:
        if self.every_steps < 0:
            raise ConfigError("checkpoint.every_steps must be >= 0 (0 = only at the end)")
        if self.keep_last < 1:
            raise ConfigError(
                f"checkpoint.keep_last={self.keep_last}: keep at least 1 checkpoint (the newest; rotation deletes "
                "the older ones)"
            )
