"""Prompt datasets (JSONL/Parquet rows with id, prompt, answer) and the embedded synthetic task."""

from pc_megatron.data.dataset import PromptRow, load_rows, write_jsonl
from pc_megatron.data.sampler import PromptSampler

__all__ = ["PromptRow", "PromptSampler", "load_rows", "write_jsonl"]
