"""What this machine gives a run, resolved when the run starts: the learner's precision
(``learner.bf16: auto``) and each process's threads (``threads: auto``, ``rollout.threads: auto``).

**Precision**: ``learner/precision.py``.

**Threads.** ``auto`` divides the cores this process may use (``os.sched_getaffinity``: SLURM and
containers restrict it, ``os.cpu_count`` does not see that) among the processes that compute at the
same time:

- the synchronous loop (``rollout.max_staleness`` = 0): the learner and the engines take turns, so
  the learner's ranks share every core, and so do the engines' workers;
- η >= 1: the engines generate while the learner trains, so the learner's ranks and the engines'
  workers split the cores between them; vLLM's CPU workers are bound (``VLLM_CPU_OMP_THREADS_BIND``)
  to the last cores, the learner's threads take the first ones (their count; the learner is not pinned).

On a Ray cluster that this run joins (``ray.address``) the driver cannot see the nodes' cores: each
actor takes its bundle's CPUs (``ray.cpus_per_bundle``). An explicit setting is used as it is; one that
asks for more threads at once than there are cores is one warning line (``pc-megatron plan`` shows it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from pc_megatron.learner.precision import resolve_bf16


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class ThreadPlan:
    """Threads of each process of a run and the cores its CPU engine workers bind to."""

    cores: int
    """Cores the job may use (this process's affinity)."""
    learner: int
    """torch threads of this process and of each learner rank."""
    engine: int
    """Threads of each engine worker (vLLM's CPU workers bind this many cores each)."""
    engine_cores: tuple[int, ...]
    """The cores the engines' CPU workers bind to (empty: leave vLLM's binding alone)."""
    concurrent: bool
    """The learner and the engines compute at the same time (η >= 1)."""
    learner_procs: int
    engine_procs: int

    @property
    def oversubscribed(self) -> str:
        """One line when more threads compute at once than there are cores, else ''."""
        learner, engine = self.learner * self.learner_procs, self.engine * self.engine_procs
        busiest = learner + engine if self.concurrent else max(learner, engine)
        if busiest <= self.cores:
            return ""
        how = (
            f"{self.learner_procs} learner process(es) x {self.learner} + {self.engine_procs} engine worker(s) x "
            f"{self.engine} threads compute at the same time (rollout.max_staleness >= 1)"
            if self.concurrent
            else f"{max(learner, engine)} threads compute at once"
        )
        return f"{how} on {self.cores} cores: oversubscribed (each waits on the others); threads=auto fits them"

    def describe(self) -> str:
        turns = "at the same time" if self.concurrent else "taking turns"
        return (
            f"threads: learner {self.learner} x {self.learner_procs}, engine {self.engine} x {self.engine_procs} "
            f"({turns}, {self.cores} cores)"
        )


def _procs(cfg: Any) -> tuple[int, int]:
    """(learner processes, engine worker processes) of a run."""
    rc = cfg.rollout
    workers = rc.vllm.tensor_parallel_size if rc.backend == "vllm" else 1
    if cfg.runtime == "local":
        return 1, workers
    return cfg.learner.world_size, rc.replicas * workers


def plan_threads(cfg: Any, cores: list[int] | None = None) -> ThreadPlan:
    """The threads of ``cfg``'s processes: its explicit settings, or the placement's share of ``cores``
    (default: this process's affinity) where they are ``auto``."""
    cores = usable_cores() if cores is None else cores
    learner_procs, engine_procs = _procs(cfg)
    concurrent = cfg.rollout.max_staleness >= 1
    joined = cfg.runtime == "ray" and bool(cfg.ray.address)
    if joined:  # the nodes' cores are not ours to count: each actor takes its bundle's CPUs
        learner_auto = engine_auto = max(1, int(cfg.ray.cpus_per_bundle))
    elif concurrent:
        learner_auto = engine_auto = max(1, len(cores) // (learner_procs + engine_procs))
    else:
        learner_auto, engine_auto = max(1, len(cores) // learner_procs), max(1, len(cores) // engine_procs)
    learner = learner_auto if cfg.threads == "auto" else int(cfg.threads)
    engine_setting = cfg.rollout.threads
    if engine_setting == "auto":  # an explicit top-level setting reaches the engines too, as it always did
        engine = engine_auto if cfg.threads == "auto" else int(cfg.threads)
    else:
        engine = int(engine_setting)
    engine_cores: tuple[int, ...] = ()
    if not joined and cfg.rollout.backend == "vllm":
        need = engine * engine_procs
        engine_cores = tuple(cores[-need:]) if need <= len(cores) else ()
    return ThreadPlan(len(cores), learner, engine, engine_cores, concurrent, learner_procs, engine_procs)


@dataclass(frozen=True)
class Resolved:
    """What ``auto`` became for one run, and why (printed first, recorded in ``config.yaml``)."""

    bf16: bool
    bf16_why: str
    threads: ThreadPlan

    def params(self) -> dict[str, object]:
        """The resolved values as tracker parameters, beside the config's own (which may say ``auto``)."""
        return {
            "resolved.learner.bf16": self.bf16,
            "resolved.threads": self.threads.learner,
            "resolved.rollout.threads": self.threads.engine,
        }

    def lines(self) -> list[str]:
        out = [f"learner precision: {'bf16' if self.bf16 else 'fp32'} ({self.bf16_why})", self.threads.describe()]
        if self.threads.oversubscribed:
            out.append(f"warning: {self.threads.oversubscribed}")
        return out


def resolve_run(cfg: Any, cores: list[int] | None = None) -> tuple[Any, Resolved]:
    """``cfg`` with its ``auto`` settings made concrete for this machine, and what they became.
    A config with nothing left to resolve comes back equal."""
    plan = plan_threads(cfg, cores)
    bf16, why = resolve_bf16(cfg.learner.bf16, plan.learner)
    own_gpus = cfg.runtime == "ray" and cfg.ray.placement == "split"
    vllm = dataclasses.replace(cfg.rollout.vllm, gpu_memory_utilization=cfg.rollout.vllm.memory_share(own_gpus))
    rollout = dataclasses.replace(cfg.rollout, threads=plan.engine, vllm=vllm)
    timeout = cfg.learner.distributed_timeout_s or cfg.rollout.timeout_s + 600.0
    learner = dataclasses.replace(cfg.learner, bf16=bf16, distributed_timeout_s=timeout)
    resolved = dataclasses.replace(cfg, threads=plan.learner, learner=learner, rollout=rollout)
    return resolved, Resolved(bf16, why, plan)


def resolved_header(given: Any, resolved: Resolved) -> str:
    """The comment that heads a run's ``config.yaml``: what its ``auto`` settings resolved to."""
    parts = []
    if given.learner.bf16 == "auto":
        parts.append(f"learner.bf16=auto -> {str(resolved.bf16).lower()} ({resolved.bf16_why})")
    if given.threads == "auto":
        parts.append(f"threads=auto -> {resolved.threads.learner}")
    if given.rollout.threads == "auto":
        parts.append(f"rollout.threads=auto -> {resolved.threads.engine}")
    if not given.learner.distributed_timeout_s:
        parts.append(f"learner.distributed_timeout_s=0 -> {given.rollout.timeout_s + 600:g}")
    if given.rollout.backend == "vllm" and not given.rollout.vllm.gpu_memory_utilization:
        own = given.runtime == "ray" and given.ray.placement == "split"
        parts.append(f"rollout.vllm.gpu_memory_utilization=0 -> {given.rollout.vllm.memory_share(own):g}")
    if not parts:
        return ""
    return "# resolved when the run started, on this machine: " + "; ".join(parts) + "\n"
