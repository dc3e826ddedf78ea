"""The embedded task's sections: ``data.synthetic.*`` (the arithmetic rows and the RL pool) and
``model.tiny.*`` (the tiny Qwen2 policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


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
class SyntheticTaskConfig:
    """The embedded arithmetic task (used when data.train_path is empty)."""

    seed: int = 1234
    """Seed of the task generator (independent of the run seed, so runs share one task)."""
    num_train: int = 4000
    """RL training prompts."""
    num_eval: int = 500
    """Held-out prompts (disjoint from train and SFT by prompt text)."""
    num_sft: int = 50000
    """Warm-start (SFT) examples, disjoint from the held-out split."""
    mix: dict[str, float] = field(
        default_factory=lambda: {
            "add1": 0.5,
            "add2": 3.0,
            "add3": 1.5,
            "sub2": 2.5,
            "sub3": 0.5,
            "mul1": 1.5,
            "mul21": 1.0,
            "mul22": 0.5,
            "addthree": 0.5,
        }
    )
    """Relative weight of each problem family (see FAMILIES)."""
    pool: Literal["hard", "easy", "graded"] = "hard"
    """RL training pool. ``hard``: the train split as drawn from ``mix`` (about half the groups
    start degenerate, the paper's regime). ``easy``: prompts from ``mix`` whose pass rate under
    the initial policy lies in ``easy_pass_band`` (few degenerate groups; pc_megatron/embedded/pools.py).
    ``graded``: ``hopeless_frac`` of prompts the initial policy (almost) never solves,
    ``solved_frac`` it (almost) always solves, the rest in between (a dial from few degenerate
    groups to the paper's regime and beyond). The held-out and SFT splits, hence the
    warm-start, are the same for all."""
    easy_pass_band: list[float] = field(default_factory=lambda: [0.2, 0.8])
    """``[low, high]``: the initial policy's pass rate of every ``easy`` pool prompt."""
    hopeless_frac: float = 0.0
    """``graded`` pool: share of prompts whose initial pass rate is below 0.02."""
    solved_frac: float = 0.0
    """``graded`` pool: share of prompts whose initial pass rate is above 0.98; the rest lie in
    [0.02, 0.98], in the order the natural mix draws them."""
    pool_size: int = 0
    """RL pool size; 0 = num_train. ``hard`` takes the first pool_size train rows, ``easy`` and
    ``graded`` their first pool_size candidates in each band (so a smaller pool is a subset of
    the larger one's selection); the held-out split and the warm-start stay the same."""
    num_eval_expected: int = 2000
    """Held-out prompts added to the held-out split for the exact expected accuracy
    (``eval.expected``), drawn after the RL pool is chosen and disjoint from every split and
    the pool; its size changes nothing else (not the splits, the pool or the warm-start)."""
