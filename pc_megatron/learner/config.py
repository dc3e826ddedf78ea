"""Learner settings: parallelism, precision, optimizer and micro-batching."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pc_megatron.errors import ConfigError, check_choices


@dataclass
class LearnerConfig:
    """Megatron-Core learner."""

    tensor_parallel_size: int = 1
    """Tensor-parallel degree: must divide the model's heads, kv heads, FFN size and vocabulary.
    The learner's ranks are Ray actors (runtime=ray) or, in tests, torchrun processes."""
    pipeline_parallel_size: int = 1
    """Pipeline-parallel degree: must divide the number of layers (equal stages)."""
    data_parallel_size: int = 1
    """Data-parallel replicas of the (TP x PP) model; the learner has TP x PP x DP ranks
    (runtime=ray places them; runtime=local is one rank)."""
    distributed_optimizer: bool = False
    """Shard optimizer state (fp32 master weights, Adam moments) over data-parallel ranks
    (Megatron's distributed optimizer)."""
    transformer_impl: Literal["auto", "local", "transformer_engine"] = "auto"
    """Layer spec: 'local' (Megatron-Core modules, CPU-capable), 'transformer_engine' (GPU),
    or 'auto' (TE when CUDA and transformer_engine are available, else local)."""
    bf16: bool | str = False
    """Train in bf16 with fp32 main parameters and gradients (Megatron's mixed precision; on a CPU
    too); false = fp32 everywhere; 'auto' = bf16 on CUDA, and on a CPU with bf16 matrix instructions
    (amx_bf16 / avx512_bf16) where a matmul probe shows bf16 >= 1.5x fp32, else fp32 (resolved when the
    run starts: pc_megatron/runtime/resources.py). The engine serves the same dtype
    (rollout.vllm.dtype=auto)."""
    fp8: Literal["", "hybrid", "e4m3"] = ""
    """FP8 GEMMs through Transformer Engine: '' (off), 'hybrid' (e4m3 forward, e5m2 backward) or
    'e4m3'. Needs a GPU, the TE layer spec and bf16."""
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "delayed"
    """TE scaling recipe: 'delayed', 'tensorwise' (Hopper and later); 'blockwise' (Hopper with CUDA >=
    12.9, and later); 'mxfp8' (Blackwell). Amax is reduced over tensor-parallel ranks only."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (shards norms/dropout activations over the TP group);
    needs tensor_parallel_size > 1 and a GPU (NCCL reduce-scatter)."""
    lr: float = 2e-4
    """Peak learning rate of the RL phase."""
    min_lr: float = 0.0
    """Final learning rate when lr_decay_style is not 'constant'."""
    lr_warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    """'constant', 'linear' or 'cosine' (Megatron's OptimizerParamScheduler)."""
    lr_decay_steps: int = 1000
    """Optimizer steps over which lr decays to min_lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    clip_grad: float = 1.0
    """Global gradient-norm clip."""
    loss_impl: Literal["auto", "triton", "torch"] = "auto"
    """Log-prob/entropy over the vocabulary: 'triton' (fused kernel, kernels/grpo_loss),
    'torch' (the reference), 'auto' (triton on CUDA, torch on CPU)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward when max_tokens_per_micro_batch is 0 (fixed rows, each
    micro-batch trimmed to its longest row); gradients accumulate over micro-batches."""
    max_tokens_per_micro_batch: int = 16384
    """Token budget of a training micro-batch on one GPU (verl's ppo_max_token_len_per_gpu): rows
    are dealt to data-parallel ranks by workload and fill micro-batches of at most this many
    processed positions (padding included); a longer row runs alone. 0 = fixed rows
    (micro_batch_size)."""
    logprob_max_tokens_per_micro_batch: int = 0
    """Token budget of the forward-only log-prob passes (no activations kept for a backward, so it
    can be larger); 0 = max_tokens_per_micro_batch."""
    packing: bool = True
    """Lay each micro-batch out as one packed stream (THD: rows end to end, attention within each
    row) instead of a padded matrix: no position is spent on padding. TE's attention on GPU;
    the local spec (CPU) runs it through pc_megatron/learner/packed_attention.py."""
    distributed_timeout_s: float = 0.0
    """Deadline of the learner's collectives (its process groups: the world's and Megatron's): a rank
    that waits longer in one raises. 0 = the engines' deadline (``rollout.timeout_s``) plus 10 minutes,
    resolved when the run starts: in a routed weight sync the other ranks wait in a barrier while rank 0
    waits on an engine, and the engine's deadline must fire first so that the error names it (NCCL's
    default is 10 minutes, against the engines' 30)."""
    share_prompts: bool = False
    """Packed micro-batches carry a prompt once for all the rows that share it (a GRPO group's n
    answers): the other rows attend to it where it is, with positions continuing from it, so the
    prompt's forward and backward run once, not n times (the same gradients, up to float rounding).
    Needs packing, a token budget and the local layer spec (its attention reads the shared prompt;
    Transformer Engine's cannot): CPU learners. Pays when prompts are long beside the answers."""
    offload_during_rollout: bool = False
    """Colocated GPU runs: move optimizer state and gradient buffers to host memory while the
    engine generates, back before the next update (frees room for the engine's KV cache). No
    effect on CPU, where there is no device memory to free."""

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def validate(self) -> None:
        if self.data_parallel_size < 1:
            raise ConfigError("learner.data_parallel_size must be >= 1")
        if self.tensor_parallel_size < 1:
            raise ConfigError("learner.tensor_parallel_size must be >= 1")
        if self.pipeline_parallel_size < 1:
            raise ConfigError("learner.pipeline_parallel_size must be >= 1")
        check_choices(self, "learner")
        if self.bf16 not in (True, False, "auto"):
            raise ConfigError(f"learner.bf16: '{self.bf16}' is not one of true, false, auto")
        if self.fp8 and self.bf16 is not True:
            raise ConfigError("learner.fp8 needs learner.bf16=true (FP8 GEMMs inside a bf16 model)")
        if self.sequence_parallel and self.tensor_parallel_size < 2:
            raise ConfigError("learner.sequence_parallel needs learner.tensor_parallel_size > 1")
        if self.micro_batch_size < 1:
            raise ConfigError("learner.micro_batch_size must be >= 1")
        for key in ("max_tokens_per_micro_batch", "logprob_max_tokens_per_micro_batch"):
            if getattr(self, key) < 0:
                raise ConfigError(f"learner.{key} must be >= 0 (0 = {'fixed rows' if key[0] == 'm' else 'the same'})")
        if self.lr <= 0:
            raise ConfigError("learner.lr must be > 0")
        if self.distributed_timeout_s < 0:
            raise ConfigError("learner.distributed_timeout_s must be >= 0 (0 = rollout.timeout_s + 600)")
        if self.share_prompts and not (self.packing and self.max_tokens_per_micro_batch > 0):
            raise ConfigError(
                "learner.share_prompts lays prompts out once in packed micro-batches: it needs learner.packing=true "
                "and learner.max_tokens_per_micro_batch > 0 (or set learner.share_prompts=false)"
            )
