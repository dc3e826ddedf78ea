"""Opening a run: everything between a config and the first step, in the order that loses nothing.

1. What ``auto`` becomes on this machine (dtype, threads: ``runtime/resources.py``), printed first.
2. What can be checked before a folder or a process exists: the data and the model (``prepare.py``),
   the learner's layout against the model, the runtime, the trackers' packages and servers.
3. The folder claimed; on a resume the checkpoint found and its inputs compared (``state.py``), so a
   resume on other inputs stops before a file changes or a process starts; ``config.yaml`` written.
4. The trackers, the signal handlers, the reward pool, the learner and the engines (``runtime/``).

``open_run`` is a context manager: whatever it opened is closed when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from pc_megatron.config import RunConfig, leaf_values
from pc_megatron.data.task import Task
from pc_megatron.errors import ConfigError
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.run.folder import RunFolder, run_fingerprint
from pc_megatron.run.preemption import RunStopped, StopRequests, record_processes
from pc_megatron.run.prepare import prepare_run
from pc_megatron.run.state import RunState
from pc_megatron.run.trackers import Trackers, check_trackers
from pc_megatron.runtime.resources import Resolved, resolve_run, resolved_header
from pc_megatron.runtime.roles import Runtime, build_runtime


@dataclass
class Run:
    """An open run: its config as resolved, its folder and state, and the parts the loop drives."""

    cfg: RunConfig
    folder: RunFolder
    task: Task
    policy_dir: Path
    tokenizer: object
    state: RunState
    trackers: Trackers
    stop: StopRequests
    rewards: RewardPool
    runtime: Runtime
    t_start: float

    @property
    def path(self) -> Path:
        return self.folder.path


@contextlib.contextmanager
def open_run(given: RunConfig, folder: RunFolder) -> Iterator[Run]:
    """The run of ``given`` in ``folder``, open (see the module's docstring), closed on the way out."""
    t_start = time.time()
    cfg, resolved = resolve_run(given)  # learner.bf16 and threads: auto, for this machine and placement
    for line in resolved.lines():
        print(line, flush=True)
    torch.set_num_threads(cfg.threads)
    prepared = prepare_run(cfg, progress=cfg.progress)
    preflight(cfg, prepared.policy_dir)
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.closing(folder.claim()))  # let go however the run ends (a kill too)
        state = RunState(
            folder.path, run_fingerprint(cfg, prepared.task, prepared.tokenizer, prepared.policy_dir), folder.resume
        )
        if folder.resume:
            folder.accept_resume()
        folder.write_config(resolved_header(given, resolved), given)
        if any(prepared.task.dropped.values()):
            print(
                f"prompts over data.max_prompt_tokens={cfg.data.max_prompt_tokens}, left out: {prepared.task.dropped}",
                flush=True,
            )
        trackers = Trackers(cfg.loggers, folder.path, leaf_values(given) | resolved.params(), state.resume_step)
        stack.push(lambda kind, _e, _tb: trackers.close(tracker_status(kind)))
        stop = stack.enter_context(StopRequests())
        rewards = stack.enter_context(RewardPool(cfg.reward))
        runtime = start_runtime(cfg, prepared.policy_dir, folder.path, resolved)
        stack.callback(runtime.close)
        print(read_back_dtypes(runtime), flush=True)
        record_processes(folder.path)
        parts = (prepared.task, prepared.policy_dir, prepared.tokenizer)
        yield Run(cfg, folder, *parts, state, trackers, stop, rewards, runtime, t_start)


def start_runtime(cfg: RunConfig, policy_dir: Path, run_dir: Path, resolved: Resolved) -> Runtime:
    """The learner and the engines, placed by ``cfg.runtime``, serving ``policy_dir`` as version 0."""
    return build_runtime(
        cfg.runtime,
        cfg.learner,
        cfg.rollout,
        cfg.ray,
        policy_dir,
        run_dir,
        cfg.seed,
        resolved.threads,
        reference=cfg.algo.loss.kl_coef > 0,
    )


def read_back_dtypes(runtime: Runtime) -> str:
    """One line: the dtypes the learner's parameters and the engine hold, asked of them (not the config)."""
    counts = runtime.learner.param_dtypes()
    total = sum(counts.values()) or 1
    shares = ", ".join(
        f"{k.removeprefix('torch.')} {v / total:.1%}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
    )
    return (
        f"dtypes read back: learner parameters {shares}; engine {runtime.fleet.served_dtype().removeprefix('torch.')}"
    )


def tracker_status(kind: type | None) -> str:
    """How a tracker run ends: FINISHED, KILLED (a signal stopped it; it resumes) or FAILED."""
    if kind is None:
        return "FINISHED"
    return "KILLED" if issubclass(kind, (RunStopped, KeyboardInterrupt)) else "FAILED"


def preflight(cfg: RunConfig, policy_dir: Path) -> None:
    """What can fail before any process starts, checked first: the learner's layout against the
    model's config.json (heads, KV heads, FFN, vocabulary, layers), then what runtime=local cannot hold
    (more than one learner rank or engine), the local engine's weight route, the trackers, and a
    cluster address that must answer."""
    from pc_megatron.model.arch import load_arch
    from pc_megatron.weight_sync.sharding import check_divisible

    lc = cfg.learner
    check_divisible(load_arch(policy_dir), lc.tensor_parallel_size, lc.pipeline_parallel_size)
    if cfg.runtime == "local" and lc.world_size > 1:  # the one place that says it (after the layout's reason)
        raise ConfigError(
            f"learner TP x PP x DP = {lc.world_size} ranks need runtime=ray (runtime=local is one process)"
        )
    if cfg.runtime == "local" and cfg.rollout.replicas > 1:
        raise ConfigError("rollout.replicas > 1 needs runtime=ray (runtime=local runs one engine)")
    check_trackers(cfg.loggers)
    if cfg.runtime == "local" and cfg.rollout.backend == "vllm":  # the engine's workers and their one route
        from pc_megatron.weight_sync.routes import Slot, plan_routes

        workers = [Slot("local", w) for w in range(cfg.rollout.vllm.tensor_parallel_size)]
        plan_routes(
            [Slot("local", 0)],
            [workers],
            on_gpu=torch.cuda.is_available(),
            placement="colocated",
            transport=cfg.rollout.weight_sync.transport,
            runtime="local",
            engine="vllm",
        )
    if cfg.runtime == "ray" and cfg.ray.address:
        from pc_megatron.runtime.ray_cluster import check_join_token, check_reachable

        check_reachable(cfg.ray.address, cfg.ray.connect_timeout_s)
        check_join_token(cfg.ray.address)
