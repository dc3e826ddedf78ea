"""Megatron ↔ Hugging Face parameter mapping, shared by weight sync and checkpoint export."""

from pc_megatron.weight_sync.mapping import megatron_to_hf

__all__ = ["megatron_to_hf"]
