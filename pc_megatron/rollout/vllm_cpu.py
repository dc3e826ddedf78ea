"""vLLM's CPU backend: which cores its workers bind to, and the environment they start with."""

from __future__ import annotations

import contextlib
import os

from pc_megatron.errors import ConfigError


def cpu_thread_binding(tensor_parallel_size: int, cores: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tensor_parallel_size`` CPU workers: this process's cores
    in equal, disjoint slices (``"0|1"``, ``"0,1|2,3"``). vLLM's own ``auto`` binding wants one NUMA
    node per worker, which a one-socket machine does not have."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if len(cores) < tensor_parallel_size:
        raise ConfigError(
            f"rollout.vllm.tensor_parallel_size={tensor_parallel_size} on CPU needs a core per worker, "
            f"this process may use {len(cores)}: lower it, or set VLLM_CPU_OMP_THREADS_BIND yourself"
        )
    per = len(cores) // tensor_parallel_size
    return "|".join(",".join(map(str, cores[w * per : (w + 1) * per])) for w in range(tensor_parallel_size))


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """``values`` in this process's environment for the block (the engine's worker processes inherit
    them when they start), then as they were."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
