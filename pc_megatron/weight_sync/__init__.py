"""Megatron ↔ Hugging Face parameter mapping, shared by weight sync and checkpoint export."""

from pc_megatron.weight_sync.mapping import hf_to_megatron, megatron_to_hf

__all__ = ["hf_to_megatron", "megatron_to_hf"]
