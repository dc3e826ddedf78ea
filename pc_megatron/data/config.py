"""Prompt datasets (``data.*``): user files, a generator, or the embedded synthetic task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pc_megatron.data.word_problems import WordProblemsConfig
from pc_megatron.embedded.config import SyntheticTaskConfig
from pc_megatron.embedded.task import validate_mix, validate_pool
from pc_megatron.errors import ConfigError, check_choices


@dataclass
class DataConfig:
    """Prompt datasets."""

    train_path: str = ""
    """JSONL/Parquet with id, prompt, answer, or verl's schema (chat messages in ``prompt``,
    ``reward_model.ground_truth``), a folder written by ``datasets``' ``save_to_disk``, or
    ``hf://datasets/ORG/NAME/FILE`` (through the Hugging Face cache); empty = the embedded synthetic task."""
    eval_path: str = ""
    """Held-out rows, in any form train_path takes (as ``eval_accuracy``); with train_path, this or
    ``eval.sets``."""
    chat_template: Literal["auto", "always", "never"] = "auto"
    """Apply the tokenizer's chat template: 'auto' = to rows given as chat messages, 'always' =
    also to plain prompts (as one user message), 'never'."""
    instruction: str = ""
    """Appended to the last user message of every prompt (train and eval), e.g. the recipe's
    "Let's think step by step and output the final answer within \\boxed{}."."""
    max_prompt_tokens: int = 0
    """Leave out prompts longer than this many tokens (after the template; counted and
    reported as ``data/dropped_long_prompts``); 0 = keep all."""
    generator: Literal["", "word_problems"] = ""
    """Rows made by the project instead of read from files: 'word_problems' (arithmetic word
    problems on a difficulty ladder, data.word_problems; train and held-out splits, cached). Empty
    with no train_path = the embedded synthetic task."""
    word_problems: WordProblemsConfig = field(default_factory=WordProblemsConfig)
    synthetic: SyntheticTaskConfig = field(default_factory=SyntheticTaskConfig)

    @property
    def embedded(self) -> bool:
        """The run trains on the embedded synthetic task (no data files, no generator)."""
        return not self.train_path and not self.generator

    def validate(self) -> None:
        check_choices(self, "data")
        if self.max_prompt_tokens < 0:
            raise ConfigError("data.max_prompt_tokens must be >= 0 (0 = no limit)")
        if self.generator and self.train_path:
            raise ConfigError("data.generator makes the training rows: unset data.train_path (or the generator)")
        if self.generator:
            self.word_problems.validate()
        syn = self.synthetic
        if self.embedded:
            validate_mix(dict(syn.mix))
            validate_pool(syn.pool, list(syn.easy_pass_band), syn.hopeless_frac, syn.solved_frac)
            if not 0 <= syn.pool_size <= syn.num_train:
                raise ConfigError(
                    f"data.synthetic.pool_size={syn.pool_size}: must be between 0 (all) and num_train={syn.num_train}"
                )
        elif syn.pool != "hard":
            raise ConfigError("data.synthetic.pool selects a pool of the embedded task: unset it with data.train_path")
